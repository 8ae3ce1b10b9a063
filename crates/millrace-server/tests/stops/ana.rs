//! NVMe paths and ANA through the API: a server with two NVMe/TCP listeners, an export in an ANA
//! group of its own, each path's state set and shown (exports, /metrics), bad requests
//! refused with a sentence, and the states served again after a restart on the same listeners.

use crate::common;

use serde_json::{json, Value};

struct Server {
    url: String,
    agent: ureq::Agent,
    _dir: tempfile::TempDir,
}

impl Server {
    fn call(&self, method: &str, p: &str, body: Option<Value>) -> (u16, Value) {
        common::call_json(&self.agent, &self.url, method, p, body)
    }
    fn refused(&self, p: &str, body: Value, status: u16) -> String {
        let (st, v) = self.call("PUT", p, Some(body));
        assert_eq!(st, status, "{v}");
        v["error"].as_str().expect("an error sentence").to_string()
    }
}

/// A server on `home` in a thread of its own, with NVMe/TCP on `nvme`; its URL once it names
/// one other than `not`, and the thread, which ends when the server stops.
fn start(
    home: &std::path::Path,
    nvme: Vec<std::net::SocketAddr>,
    not: Option<&str>,
) -> (String, std::thread::JoinHandle<()>) {
    let cfg = millrace_server::ServeConfig {
        nvme,
        ..common::config(home)
    };
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(millrace_server::run(cfg))
            .expect("the server stops cleanly");
    });
    (common::wait_url(home, not), server)
}

#[test]
fn each_listener_is_a_path_whose_ana_state_is_set_and_shown() {
    let _turn = crate::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let any = "127.0.0.1:0".parse().unwrap();
    let home = dir.path().join("home");
    let (url, server) = start(&home, vec![any, any], None);
    let agent = common::agent();
    let s = Server {
        url,
        agent,
        _dir: dir,
    };
    let (_, st) = s.call("GET", "/api/v1/status", None);
    let listeners: Vec<String> = (st["nvme_listeners"].as_array().unwrap().iter())
        .map(|l| format!("{}:{}", l["address"].as_str().unwrap(), l["port"]))
        .collect();
    assert_eq!(listeners.len(), 2, "{st}");
    assert_ne!(listeners[0], listeners[1]);

    let drives: Vec<String> = (0..2)
        .map(|i| {
            s._dir
                .path()
                .join(format!("d{i}.img"))
                .display()
                .to_string()
        })
        .collect();
    let (st, v) = s.call(
        "POST",
        "/api/v1/pools",
        Some(json!({"name": "tank", "level": "raid1", "drives": drives, "create_size_bytes": 16u64 << 20})),
    );
    assert_eq!(st, 201, "{v}");
    let (st, v) = s.call(
        "POST",
        "/api/v1/pools/tank/volumes",
        Some(json!({"name": "v", "size_bytes": 4u64 << 20})),
    );
    assert_eq!(st, 201, "{v}");
    let host = "nqn.2014-08.org.nvmexpress:uuid:00000049-0000-0000-0000-000000000000";
    let export =
        |group: u32| json!({"pool": "tank", "volume": "v", "hosts": [host], "ana_group": group});
    let (st, v) = s.call("POST", "/api/v1/exports/nvme", Some(export(200)));
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("ANA group 200 is out of range"),
        "{v}"
    );
    let (st, v) = s.call("POST", "/api/v1/exports/nvme", Some(export(7)));
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["ana_group"], 7);

    let (_, ex) = s.call("GET", "/api/v1/exports", None);
    let e = &ex["nvme"][0];
    assert_eq!(e["ana_group"], 7, "{e}");
    let paths = e["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 2, "{e}");
    assert!(
        paths
            .iter()
            .all(|p| p["state"] == "optimized" && p["transport"] == "tcp"),
        "{e}"
    );

    let ana = "/api/v1/exports/nvme/tank/v/ana";
    let (st, v) = s.call(
        "PUT",
        ana,
        Some(json!({"listener": listeners[0], "state": "inaccessible"})),
    );
    assert_eq!(st, 200, "{v}");
    let state_of = |v: &Value, l: &str| {
        (v["paths"].as_array().unwrap().iter())
            .find(|p| p["listener"] == l)
            .map(|p| p["state"].clone())
    };
    assert_eq!(
        state_of(&v, &listeners[0]),
        Some(json!("inaccessible")),
        "{v}"
    );
    assert_eq!(state_of(&v, &listeners[1]), Some(json!("optimized")), "{v}");
    let (_, ex) = s.call("GET", "/api/v1/exports", None);
    assert_eq!(
        state_of(&ex["nvme"][0], &listeners[0]),
        Some(json!("inaccessible"))
    );
    let mut r = s.agent.get(format!("{}/metrics", s.url)).call().unwrap();
    let metrics = r.body_mut().read_to_string().unwrap();
    let line = format!(
        "listener=\"{}\",group=\"7\",state=\"inaccessible\"}} 1",
        listeners[0]
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("millrace_nvme_ana_state{") && l.contains(&line)),
        "{metrics}"
    );

    // Refusals say what was wrong, and change nothing.
    let msg = s.refused(
        ana,
        json!({"listener": "127.0.0.1:1", "state": "optimized"}),
        400,
    );
    assert!(
        msg.contains("no tcp listener on 127.0.0.1:1") && msg.contains(&listeners[1]),
        "{msg}"
    );
    let msg = s.refused(
        ana,
        json!({"listener": listeners[1], "state": "sideways"}),
        400,
    );
    assert!(msg.contains("not an ANA state"), "{msg}");
    let msg = s.refused(ana, json!({"listener": "here", "state": "optimized"}), 400);
    assert!(msg.contains("ADDR:PORT"), "{msg}");
    let msg = s.refused(
        ana,
        json!({"listener": listeners[1], "transport": "udp", "state": "optimized"}),
        400,
    );
    assert!(msg.contains("tcp or rdma"), "{msg}");
    let msg = s.refused(
        "/api/v1/exports/nvme/tank/w/ana",
        json!({"listener": listeners[1], "state": "optimized"}),
        404,
    );
    assert!(msg.contains("no volume named w"), "{msg}");
    let (_, ex) = s.call("GET", "/api/v1/exports", None);
    assert_eq!(
        state_of(&ex["nvme"][0], &listeners[1]),
        Some(json!("optimized"))
    );
    assert_eq!(
        state_of(&ex["nvme"][0], &listeners[0]),
        Some(json!("inaccessible"))
    );

    // A path set back to optimized is forgotten; the other holds through a restart on the
    // same listeners, and hosts connecting there see it from the start.
    let (st, v) = s.call(
        "PUT",
        ana,
        Some(json!({"listener": listeners[1], "state": "non-optimized"})),
    );
    assert_eq!(st, 200, "{v}");
    let (st, v) = s.call(
        "PUT",
        ana,
        Some(json!({"listener": listeners[1], "state": "optimized"})),
    );
    assert_eq!(st, 200, "{v}");
    crate::sigterm();
    server.join().unwrap();
    let addrs = listeners.iter().map(|l| l.parse().unwrap()).collect();
    let (url, server) = start(&home, addrs, Some(&s.url));
    let s = Server { url, ..s };
    let (_, ex) = s.call("GET", "/api/v1/exports", None);
    let e = &ex["nvme"][0];
    assert_eq!(
        state_of(e, &listeners[0]),
        Some(json!("inaccessible")),
        "{e}"
    );
    assert_eq!(state_of(e, &listeners[1]), Some(json!("optimized")), "{e}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use millrace_nvmf::initiator::{HostController, HostOptions};
        let nqn = e["nqn"].as_str().unwrap();
        let o = HostOptions {
            hostnqn: host.into(),
            ..Default::default()
        };
        for (l, path_error) in [(&listeners[0], true), (&listeners[1], false)] {
            let c = HostController::connect(l.parse().unwrap(), nqn, &o, 1)
                .await
                .unwrap();
            let id = c.admin.identify(0, 1).await.unwrap();
            let lba = 1u32 << id[128 + 4 * (id[26] & 0xf) as usize + 2];
            let r = c.io[0].write(1, 0, vec![7u8; lba as usize], lba).await;
            let st = r.err().and_then(|e| e.status());
            assert_eq!(
                st.map(|s| (s.sct, s.sc)),
                path_error.then_some((3, 2)),
                "a write through {l}"
            );
        }
    });
    crate::sigterm();
    server.join().unwrap();
}
