//! The HTTP API over real HTTP: each test starts `millrace_server::run` on an ephemeral port
//! with a home of its own, then talks to it with ureq as any client would.

use crate::common;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

struct Server {
    url: String,
    dir: tempfile::TempDir,
    agent: ureq::Agent,
    token: Option<String>,
}

/// Starts a server on 127.0.0.1:0 in a runtime of its own; it lives as long as the test process.
fn start(token: Option<&str>) -> Server {
    start_in(tempfile::tempdir().unwrap(), token, None)
}

fn start_in(
    dir: tempfile::TempDir,
    token: Option<&str>,
    tls: Option<millrace_server::TlsFiles>,
) -> Server {
    start_with(dir, token, tls, None)
}

fn start_with(
    dir: tempfile::TempDir,
    token: Option<&str>,
    tls: Option<millrace_server::TlsFiles>,
    nvme: Option<std::net::SocketAddr>,
) -> Server {
    start_rdma(dir, token, tls, nvme, Vec::new())
}

fn start_rdma(
    dir: tempfile::TempDir,
    token: Option<&str>,
    tls: Option<millrace_server::TlsFiles>,
    nvme: Option<std::net::SocketAddr>,
    nvme_rdma: Vec<std::net::SocketAddr>,
) -> Server {
    let home = dir.path().join("home");
    let url = common::spawn(
        millrace_server::ServeConfig {
            nvme: nvme.into_iter().collect(),
            nvme_rdma,
            token: token.map(str::to_string),
            tls,
            ..common::config(&home)
        },
        None,
    );
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    Server {
        url,
        dir,
        agent,
        token: token.map(str::to_string),
    }
}

type Resp = ureq::http::Response<ureq::Body>;

impl Server {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn auth<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => r.header("Authorization", &format!("Bearer {t}")),
            None => r,
        }
    }
    fn get(&self, p: &str) -> (u16, Value) {
        json_of(self.auth(self.agent.get(format!("{}{p}", self.url))).call())
    }
    fn delete(&self, p: &str) -> (u16, Value) {
        json_of(
            self.auth(self.agent.delete(format!("{}{p}", self.url)))
                .call(),
        )
    }
    fn post(&self, p: &str, body: Value) -> (u16, Value) {
        json_of(
            self.auth(self.agent.post(format!("{}{p}", self.url)))
                .send_json(&body),
        )
    }
    fn put(&self, p: &str) -> (u16, Value) {
        json_of(
            self.auth(self.agent.put(format!("{}{p}", self.url)))
                .send(&b""[..]),
        )
    }
    fn patch(&self, p: &str, body: Value) -> (u16, Value) {
        json_of(
            self.auth(self.agent.patch(format!("{}{p}", self.url)))
                .send_json(&body),
        )
    }
    fn post_raw(&self, p: &str, body: &str) -> (u16, Value) {
        json_of(
            self.auth(self.agent.post(format!("{}{p}", self.url)))
                .header("Content-Type", "application/json")
                .send(body),
        )
    }
    fn text(&self, p: &str) -> (u16, String) {
        let mut r = self
            .auth(self.agent.get(format!("{}{p}", self.url)))
            .call()
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    }

    /// Six 32 MiB drive files in a RAID 6 pool named `name`.
    fn create_pool(&self, name: &str) -> Value {
        let drives: Vec<String> = (0..6)
            .map(|i| self.path(&format!("{name}-{i}.img")).display().to_string())
            .collect();
        let (st, v) = self.post(
            "/api/v1/pools",
            json!({"name": name, "level": "raid6", "strip_bytes": 65536, "drives": drives, "create_size_bytes": 32u64 << 20}),
        );
        assert_eq!(st, 201, "creating the pool: {v}");
        v
    }

    fn wait_job(&self, id: u64) -> Value {
        let t0 = Instant::now();
        loop {
            let (st, j) = self.get(&format!("/api/v1/jobs/{id}"));
            assert_eq!(st, 200, "{j}");
            if j["state"] != "running" {
                return j;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "job {id} still runs: {j}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn json_of(r: Result<Resp, ureq::Error>) -> (u16, Value) {
    let mut r = r.expect("the server answers");
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    let v = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("HTTP {status}: the body is not JSON ({e}): {text:?}"));
    (status, v)
}

/// A refusal: the status asked for, and a sentence in `error`.
fn refused(r: (u16, Value), status: u16) -> String {
    assert_eq!(r.0, status, "expected HTTP {status}, got {}: {}", r.0, r.1);
    let msg = r.1["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error sentence in {}", r.1))
        .to_string();
    assert!(msg.len() > 10, "a terse error: {msg:?}");
    msg
}

#[test]
fn pools_volumes_exports_and_data_round_trip() {
    let s = start(None);
    let pool = s.create_pool("tank");
    assert_eq!(pool["state"], "online");
    assert_eq!(pool["members"].as_array().unwrap().len(), 6);
    let size = pool["size_bytes"].as_u64().unwrap();
    assert!(size >= 4 * (30 << 20), "{pool}");

    // Raw bytes at the end of the pool (clear of the volume table at its start) read back.
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4096) as u8).collect();
    let off = size - data.len() as u64 - 4096;
    let mut r = s
        .agent
        .put(format!("{}/api/v1/pools/tank/data?offset={off}", s.url))
        .send(&data[..])
        .unwrap();
    assert_eq!(
        r.status(),
        200,
        "{}",
        r.body_mut().read_to_string().unwrap()
    );
    let mut r = s
        .agent
        .get(format!(
            "{}/api/v1/pools/tank/data?offset={off}&length={}",
            s.url,
            data.len()
        ))
        .call()
        .unwrap();
    assert_eq!(r.status(), 200);
    let back = r
        .body_mut()
        .with_config()
        .limit(4 << 20)
        .read_to_vec()
        .unwrap();
    assert!(
        back == data,
        "the bytes read back differ from those written"
    );
    refused(
        s.get(&format!(
            "/api/v1/pools/tank/data?offset={}&length=8192",
            size - 4096
        )),
        400,
    );
    let (_, p) = s.get("/api/v1/pools/tank");
    assert!(p["stats"]["write_bytes"].as_u64().unwrap() >= data.len() as u64);
    let member_written: u64 = p["member_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["write_bytes"].as_u64().unwrap())
        .sum();
    // RAID 6 writes the data and two parities.
    assert!(member_written >= data.len() as u64 * 6 / 4, "{p}");

    // Volumes: create, refuse a twin, grow, read, delete.
    let (st, v) = s.post(
        "/api/v1/pools/tank/volumes",
        json!({"name": "v", "size_bytes": 8u64 << 20}),
    );
    assert_eq!(st, 201, "{v}");
    assert!(v["size_bytes"].as_u64().unwrap() >= 8 << 20);
    refused(
        s.post(
            "/api/v1/pools/tank/volumes",
            json!({"name": "v", "size_bytes": 1u64 << 20}),
        ),
        409,
    );
    let (st, v) = s.patch(
        "/api/v1/pools/tank/volumes/v",
        json!({"size_bytes": 16u64 << 20}),
    );
    assert_eq!(st, 200, "{v}");
    assert!(v["size_bytes"].as_u64().unwrap() >= 16 << 20);
    let (_, v) = s.get("/api/v1/pools/tank/volumes/v");
    assert!(v["size_bytes"].as_u64().unwrap() >= 16 << 20);
    refused(s.get("/api/v1/pools/tank/volumes/nope"), 404);

    // Exports: NVMe/TCP is closed unless hosts are named.
    let msg = refused(
        s.post(
            "/api/v1/exports/nvme",
            json!({"pool": "tank", "volume": "v"}),
        ),
        400,
    );
    assert!(msg.contains("host"), "{msg}");
    let host = "nqn.2014-08.org.nvmexpress:uuid:0f0e0d0c-0b0a-0908-0706-050403020100";
    let (st, e) = s.post(
        "/api/v1/exports/nvme",
        json!({"pool": "tank", "volume": "v", "hosts": [host]}),
    );
    assert_eq!(st, 201, "{e}");
    let (_, ex) = s.get("/api/v1/exports");
    assert_eq!(ex["nvme"][0]["volume"], "v");
    assert_eq!(ex["nvme"][0]["hosts"][0], host);
    let msg = refused(s.delete("/api/v1/pools/tank/volumes/v"), 409);
    assert!(msg.contains("export"), "{msg}");
    refused(s.delete("/api/v1/pools/tank"), 409);
    let (st, _) = s.delete("/api/v1/exports/nvme/tank/v");
    assert_eq!(st, 200);
    let (st, _) = s.delete("/api/v1/pools/tank/volumes/v");
    assert_eq!(st, 200);
    refused(s.get("/api/v1/pools/tank/volumes/v"), 404);

    // A scrub runs to its end; then a member fails and the pool runs degraded.
    let (st, j) = s.post("/api/v1/pools/tank/scrub", json!({"repair": false}));
    assert_eq!(st, 202, "{j}");
    let j = s.wait_job(j["job"].as_u64().unwrap());
    assert_eq!(j["state"], "done", "{j}");
    assert_eq!(j["kind"], "scrub");
    assert!(j["result"]["rows_checked"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(j["result"]["mismatches"], 0, "{j}");

    let failed = s.path("tank-2.img").display().to_string();
    let (st, m) = s.post("/api/v1/pools/tank/fail", json!({"path": failed}));
    assert_eq!(st, 200, "{m}");
    let (_, p) = s.get("/api/v1/pools/tank");
    assert_eq!(p["state"], "degraded", "{p}");
    assert_eq!(p["members"][2]["state"], "faulty", "{p}");
    refused(
        s.post("/api/v1/pools/tank/fail", json!({"path": "/no/such/drive"})),
        400,
    );
    // The data is still there, rebuilt from parity.
    let mut r = s
        .agent
        .get(format!(
            "{}/api/v1/pools/tank/data?offset={off}&length={}",
            s.url,
            data.len()
        ))
        .call()
        .unwrap();
    let back = r
        .body_mut()
        .with_config()
        .limit(4 << 20)
        .read_to_vec()
        .unwrap();
    assert!(back == data, "degraded reads differ from what was written");

    let (st, m) = s.text("/metrics");
    assert_eq!(st, 200);
    assert!(
        m.contains(r#"millrace_pool_state{pool="tank",state="degraded"} 1"#),
        "{m}"
    );
    assert!(m.contains(&format!(
        r#"millrace_member_state{{pool="tank",member="2",path="{failed}",state="faulty"}} 1"#
    )));
    assert!(m.contains("millrace_member_write_bytes_total{"), "{m}");
    assert!(m.contains("millrace_pool_read_bytes_total{"), "{m}");

    // A spare takes the failed member's place and is rebuilt.
    let spare = s.path("spare.img");
    std::fs::File::create(&spare)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let (st, m) = s.post(
        "/api/v1/pools/tank/spares",
        json!({"path": spare.display().to_string()}),
    );
    assert_eq!(st, 200, "{m}");
    let (_, jobs) = s.get("/api/v1/jobs");
    let rebuild = jobs["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["kind"] == "rebuild")
        .unwrap_or_else(|| panic!("no rebuild started: {jobs}"))
        .clone();
    let j = s.wait_job(rebuild["id"].as_u64().unwrap());
    assert_eq!(j["state"], "done", "{j}");
    let (_, p) = s.get("/api/v1/pools/tank");
    assert_eq!(p["state"], "online", "{p}");

    // Destroying the pool leaves nothing served.
    let (st, v) = s.delete("/api/v1/pools/tank");
    assert_eq!(st, 200, "{v}");
    refused(s.get("/api/v1/pools/tank"), 404);
}

fn untouched(paths: &[PathBuf], pattern: u8) {
    for p in paths {
        let b = std::fs::read(p).unwrap();
        assert!(
            b.iter().all(|&x| x == pattern),
            "{} was written to by a refused request",
            p.display()
        );
    }
}

/// `--nvme-rdma` on a host without an RDMA device: reported, and NVMe/TCP serves as before.
#[test]
fn nvme_rdma_without_a_device_leaves_tcp_serving() {
    if millrace_rdma::devices::any() {
        eprintln!("skipped: this host has an RDMA device (tests/guest/nvme-rdma-serve.sh uses it)");
        return;
    }
    let nvme = "127.0.0.1:0".parse().unwrap();
    let rdma = vec!["127.0.0.1:4420".parse().unwrap()];
    let s = start_rdma(tempfile::tempdir().unwrap(), None, None, Some(nvme), rdma);
    let (_, st) = s.get("/api/v1/status");
    let ls = st["nvme_listeners"].as_array().unwrap();
    assert_eq!(ls.len(), 1, "{st}");
    assert_eq!(ls[0]["transport"], "tcp", "{st}");
    assert_eq!(st["nvme_hosts"]["rdma"], 0, "{st}");
    let port = ls[0]["port"].as_u64().unwrap() as u16;
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
}

/// What an orchestrator (the CSI driver) builds on: free space per pool, volumes tagged at
/// creation, one host added to and taken off a live export, the NVMe/TCP listeners' addresses.
#[test]
fn hosts_of_an_export_change_one_at_a_time_and_listeners_are_reported() {
    let nvme = "127.0.0.1:0".parse().unwrap();
    let s = start_with(tempfile::tempdir().unwrap(), None, None, Some(nvme));
    let (_, st) = s.get("/api/v1/status");
    let l = &st["nvme_listeners"][0];
    assert_eq!(l["transport"], "tcp", "{st}");
    assert_eq!(l["address"], "127.0.0.1", "{st}");
    let port = l["port"].as_u64().unwrap();
    assert!(port > 0, "{st}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port as u16)).is_ok());

    let pool = s.create_pool("tank");
    let free = pool["free_bytes"].as_u64().unwrap();
    assert!(free > 0 && pool["largest_free_bytes"] == free, "{pool}");
    let (st, v) = s.post(
        "/api/v1/pools/tank/volumes",
        json!({"name": "v", "size_bytes": 4u64 << 20, "props": {"csi.name": "pvc-1"}}),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["props"]["csi.name"], "pvc-1");
    let size = v["size_bytes"].as_u64().unwrap();
    let (_, p) = s.get("/api/v1/pools/tank");
    assert_eq!(p["free_bytes"].as_u64().unwrap(), free - size, "{p}");
    assert_eq!(
        p["largest_free_bytes"].as_u64().unwrap(),
        free - size,
        "{p}"
    );
    // A client cannot fake an export through props.
    let msg = refused(
        s.post(
            "/api/v1/pools/tank/volumes",
            json!({"name": "w", "size_bytes": 1u64 << 20, "props": {"export.nvme": "{}"}}),
        ),
        400,
    );
    assert!(msg.contains("export.nvme"), "{msg}");
    refused(s.get("/api/v1/pools/tank/volumes/w"), 404);

    let a = "nqn.2014-08.org.nvmexpress:uuid:0000000a-0000-0000-0000-000000000000";
    let b = "nqn.2014-08.org.nvmexpress:uuid:0000000b-0000-0000-0000-000000000000";
    let hosts = |p: &str| format!("/api/v1/exports/nvme/tank/v/hosts/{p}");
    // Before the export exists: 404 that says how to export.
    let msg = refused(s.put(&hosts(a)), 404);
    assert!(msg.contains("export nvme add"), "{msg}");
    let (st, e) = s.post(
        "/api/v1/exports/nvme",
        json!({"pool": "tank", "volume": "v", "hosts": [a]}),
    );
    assert_eq!(st, 201, "{e}");
    let nqn = e["nqn"].as_str().unwrap().to_string();
    for _ in 0..2 {
        let (st, e) = s.put(&hosts(b));
        assert_eq!(st, 200, "{e}");
        assert_eq!(e["hosts"], json!([a, b]), "adding twice keeps one: {e}");
    }
    refused(s.put(&hosts("not-an-nqn")), 400);
    refused(
        s.put("/api/v1/exports/nvme/tank/nope/hosts/nqn.2014-08.x"),
        404,
    );
    // The live target took the change, not only the record.
    let (_, ex) = s.get("/api/v1/exports");
    assert_eq!(ex["nvme"][0]["hosts"], json!([a, b]), "{ex}");
    assert_eq!(ex["nvme"][0]["nqn"], nqn.as_str());
    for _ in 0..2 {
        let (st, e) = s.delete(&hosts(a));
        assert_eq!(st, 200, "{e}");
        assert_eq!(e["hosts"], json!([b]), "{e}");
    }
    let (st, e) = s.delete(&hosts(b));
    assert_eq!(st, 200, "{e}");
    assert_eq!(e["hosts"], json!([]), "{e}");
    // The export stays, closed to everyone, until it is removed; then the volume can go.
    let (_, ex) = s.get("/api/v1/exports");
    assert_eq!(ex["nvme"][0]["hosts"], json!([]), "{ex}");
    refused(s.delete("/api/v1/pools/tank/volumes/v"), 409);
    assert_eq!(s.delete("/api/v1/exports/nvme/tank/v").0, 200);
    assert_eq!(s.delete("/api/v1/pools/tank/volumes/v").0, 200);
}

#[test]
fn bad_requests_are_400_sentences_and_change_nothing() {
    let s = start(None);
    // Drives holding something: a refused create must leave them as they are.
    let drives: Vec<PathBuf> = (0..6).map(|i| s.path(&format!("d{i}.img"))).collect();
    for d in &drives {
        std::fs::write(d, vec![0xA5u8; 4 << 20]).unwrap();
    }
    let names: Vec<String> = drives.iter().map(|d| d.display().to_string()).collect();

    let msg = refused(s.post_raw("/api/v1/pools", "{\"name\": \"x\", "), 400);
    assert!(msg.contains("request body"), "{msg}");
    refused(
        s.post_raw("/api/v1/pools", r#"{"name": "x", "level": 5}"#),
        400,
    );
    let msg = refused(
        s.post(
            "/api/v1/pools",
            json!({"name": "x", "level": "raid7", "drives": names}),
        ),
        400,
    );
    assert!(msg.contains("raid7"), "{msg}");
    // RAID 6 needs four drives at least.
    refused(
        s.post(
            "/api/v1/pools",
            json!({"name": "x", "level": "raid6", "drives": names[..2]}),
        ),
        400,
    );
    // The same drive twice.
    refused(
        s.post(
            "/api/v1/pools",
            json!({"name": "x", "level": "raid5", "drives": [names[0], names[1], names[0]]}),
        ),
        400,
    );
    // One drive missing, not created: the others are not touched either.
    let missing = s.path("missing.img");
    let mut some = names[..4].to_vec();
    some.push(missing.display().to_string());
    refused(
        s.post(
            "/api/v1/pools",
            json!({"name": "x", "level": "raid5", "drives": some}),
        ),
        400,
    );
    assert!(!missing.exists());
    // Geometry that cannot be: a strip that is not a power of two.
    refused(
        s.post(
            "/api/v1/pools",
            json!({"name": "x", "level": "raid5", "strip_bytes": 3000, "drives": names}),
        ),
        400,
    );
    untouched(&drives, 0xA5);
    let (_, pools) = s.get("/api/v1/pools");
    assert_eq!(pools["pools"], json!([]), "a refused create left a pool");

    // Query strings and paths: our JSON sentences, not axum's plain text.
    s.create_pool("p");
    let msg = refused(s.get("/api/v1/pools/p/data?offset=abc&length=4"), 400);
    assert!(msg.contains("query"), "{msg}");
    refused(s.get("/api/v1/pools/p/data?length=4"), 400);
    refused(s.get("/api/v1/pools/p/data?offset=0"), 400);
    let msg = refused(s.get("/api/v1/jobs/not-a-number"), 400);
    assert!(msg.contains("path"), "{msg}");
    refused(s.get("/api/v1/jobs/99999"), 404);
    refused(s.get("/api/v1/no/such/call"), 404);
    let msg = refused(s.delete("/api/v1/jobs"), 405);
    assert!(msg.contains("DELETE"), "{msg}");
    refused(
        s.post(
            "/api/v1/pools/p/volumes",
            json!({"name": "big", "size_bytes": 1u64 << 50}),
        ),
        400,
    );
    refused(s.post("/api/v1/pools/p/volumes", json!({"name": "v"})), 400);
    let (_, vols) = s.get("/api/v1/pools/p/volumes");
    assert_eq!(vols["volumes"], json!([]));
    refused(
        s.post(
            "/api/v1/exports/nvme",
            json!({"pool": "p", "volume": "nope", "hosts": ["nqn.2014-08.org.nvmexpress:uuid:1"]}),
        ),
        404,
    );
    let (_, ex) = s.get("/api/v1/exports");
    assert_eq!(ex["nvme"], json!([]));
}

#[test]
fn a_token_guards_the_api_but_not_the_page() {
    let mut s = start(Some("s3cret-token"));
    s.token = None;
    let msg = refused(s.get("/api/v1/pools"), 401);
    assert!(msg.contains("token"), "{msg}");
    let r = s
        .agent
        .get(format!("{}/api/v1/status", s.url))
        .call()
        .unwrap();
    assert_eq!(
        r.headers().get("www-authenticate").unwrap(),
        "Bearer",
        "missing token: no WWW-Authenticate"
    );
    refused(s.get("/metrics"), 401);
    s.token = Some("wrong".into());
    let msg = refused(s.get("/api/v1/pools"), 401);
    assert!(msg.contains("wrong"), "{msg}");
    let before = std::fs::read_dir(s.dir.path()).unwrap().count();
    refused(
        s.post(
            "/api/v1/pools",
            json!({"name": "x", "level": "raid5", "drives": ["/tmp/a", "/tmp/b", "/tmp/c"], "create_size_bytes": 1u64 << 20}),
        ),
        401,
    );
    assert_eq!(std::fs::read_dir(s.dir.path()).unwrap().count(), before);
    s.token = Some("s3cret-token".into());
    let (st, v) = s.get("/api/v1/pools");
    assert_eq!(st, 200, "{v}");
    // The scheme is case-insensitive (RFC 7235): curl users write "bearer".
    for scheme in ["bearer", "BEARER", "BeArEr"] {
        let r = s
            .agent
            .get(format!("{}/api/v1/pools", s.url))
            .header("Authorization", &format!("{scheme} s3cret-token"))
            .call()
            .unwrap();
        assert_eq!(r.status(), 200, "scheme {scheme} refused");
    }
    let (st, _) = s.text("/metrics");
    assert_eq!(st, 200);
    // The page holds no data and loads without the token; it asks for one when the API does.
    s.token = None;
    let (st, page) = s.text("/");
    assert_eq!(st, 200);
    assert!(
        page.contains("Authorization"),
        "the page never sends a token"
    );
}

/// Every call the OpenAPI document lists is routed (none answers our 404 "no such API call"),
/// and every response it names has a JSON schema.
#[test]
fn every_documented_call_is_routed() {
    let s = start(None);
    let (st, doc) = s.get("/api/v1/openapi.json");
    assert_eq!(st, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 15, "{}", paths.len());
    for (path, ops) in paths {
        let concrete = path
            .replace("{pool}", "nopool")
            .replace("{vol}", "novol")
            .replace("{id}", "424242")
            .replace("{host}", "nqn.2014-08.org.nvmexpress:nohost");
        for (method, op) in ops.as_object().unwrap() {
            assert!(op["responses"].is_object(), "{method} {path}: no responses");
            let url = format!("{}{concrete}", s.url);
            let r = match method.as_str() {
                "get" => s.agent.get(&url).call(),
                "delete" => s.agent.delete(&url).call(),
                "post" => s.agent.post(&url).send_json(json!({})),
                "patch" => s.agent.patch(&url).send_json(json!({})),
                "put" => s.agent.put(&url).send(&b""[..]),
                m => panic!("{m} {path}: a method the test does not know"),
            };
            let (status, body) = json_of(r);
            let documented = op["responses"].get(status.to_string()).is_some();
            assert!(
                documented,
                "{method} {path} answered {status}, which the document does not list: {body}"
            );
            assert!(
                !body["error"]
                    .as_str()
                    .unwrap_or("")
                    .contains("no such API call"),
                "{method} {path} is documented but not routed"
            );
        }
    }
}

/// Every handler of the API is in the OpenAPI document: each `async fn` of the handler modules
/// (src/api/*.rs but the router and the extractors) is an operation of the served document,
/// so a call routed by hand beside the generated routes fails here.
#[test]
fn every_handler_is_documented() {
    let s = start(None);
    let (st, doc) = s.get("/api/v1/openapi.json");
    assert_eq!(st, 200);
    let mut ops = std::collections::BTreeSet::new();
    for (_, item) in doc["paths"].as_object().unwrap() {
        for (_, op) in item.as_object().unwrap() {
            if let Some(id) = op["operationId"].as_str() {
                ops.insert(id.to_string());
            }
        }
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
    let mut handlers = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name == "mod.rs" || name == "extract.rs" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for line in text.lines() {
            if let Some(rest) = line.trim_start().strip_prefix("async fn ") {
                handlers.push(rest.split('(').next().unwrap().to_string());
            }
        }
    }
    assert!(
        handlers.len() >= 30,
        "found only {} handlers",
        handlers.len()
    );
    for h in &handlers {
        assert!(
            ops.contains(h),
            "the handler {h} is not in /api/v1/openapi.json; give it a #[utoipa::path] and route it with routes!()"
        );
    }
}

/// A certificate for 127.0.0.1 signed by a throwaway CA, made with the openssl command; the
/// certificate file holds the chain (the server's, then the CA's), as `--tls-cert` takes it.
fn test_certificate(dir: &std::path::Path) -> millrace_server::TlsFiles {
    let run = |args: &[&str]| {
        let st = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("the openssl command (Debian package openssl) makes the test certificate");
        assert!(st.success(), "openssl {args:?} failed");
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    run(&[
        &["req", "-x509"][..],
        &ec,
        &["-days", "2", "-subj", "/CN=millrace test CA"],
        &["-keyout", "ca.key", "-out", "ca.crt"],
    ]
    .concat());
    run(&[
        &["req"][..],
        &ec,
        &[
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "api.key",
            "-out",
            "api.csr",
        ],
    ]
    .concat());
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "api.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
        "-out",
        "leaf.crt",
    ]);
    let chain = [
        std::fs::read(dir.join("leaf.crt")).unwrap(),
        std::fs::read(dir.join("ca.crt")).unwrap(),
    ]
    .concat();
    std::fs::write(dir.join("api.crt"), chain).unwrap();
    millrace_server::TlsFiles {
        cert: dir.join("api.crt"),
        key: dir.join("api.key"),
    }
}

#[test]
fn tls_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let tls = test_certificate(dir.path());
    let pem = std::fs::read(&tls.cert).unwrap();
    let mut s = start_in(dir, Some("tok"), Some(tls.clone()));
    assert!(s.url.starts_with("https://127.0.0.1:"), "{}", s.url);
    let sf: millrace_server::ServerFile = serde_json::from_str(
        &std::fs::read_to_string(millrace_server::server_file(&s.path("home"))).unwrap(),
    )
    .unwrap();
    assert!(
        sf.tls_cert.is_some(),
        "the server file names no certificate"
    );

    // A client that does not trust the certificate gets nowhere.
    let r = s.agent.get(format!("{}/api/v1/status", s.url)).call();
    assert!(r.is_err(), "an untrusted certificate was accepted");
    // Nor does plain HTTP on the same port.
    let plain = s.url.replace("https://", "http://");
    let r = s.agent.get(format!("{plain}/api/v1/status")).call();
    assert!(
        !r.map(|r| r.status().as_u16() == 200).unwrap_or(false),
        "plain HTTP was answered"
    );

    // Trusting it: the API answers, and still wants its token.
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|i| match i {
            Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
            _ => None,
        })
        .collect();
    s.agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(certs)))
                .build(),
        )
        .build()
        .into();
    s.token = None;
    refused(s.get("/api/v1/status"), 401);
    s.token = Some("tok".into());
    let (st, v) = s.get("/api/v1/status");
    assert_eq!(st, 200, "{v}");
    s.create_pool("secure");
    let (_, p) = s.get("/api/v1/pools/secure");
    assert_eq!(p["state"], "online");
}

#[test]
fn a_bad_certificate_stops_the_start_with_a_sentence() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bad.crt"), "not a certificate").unwrap();
    std::fs::write(dir.path().join("bad.key"), "not a key").unwrap();
    let cfg = millrace_server::ServeConfig {
        tls: Some(millrace_server::TlsFiles {
            cert: dir.path().join("bad.crt"),
            key: dir.path().join("bad.key"),
        }),
        ..common::config(&dir.path().join("home"))
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt.block_on(millrace_server::run(cfg)).unwrap_err();
    let msg = format!("{e:#}");
    assert!(msg.contains("bad.crt") && msg.contains("PEM"), "{msg}");
    assert!(!millrace_server::server_file(&dir.path().join("home")).exists());
}

#[test]
fn bench_runs_are_jobs_with_the_bench_results() {
    let s = start(None);
    s.create_pool("bp");
    // A simulated pool: every workload, measured in a fraction of a second per point.
    let (st, v) = s.post(
        "/api/v1/bench",
        json!({"sim": "4x100M", "level": "raid5", "strip_bytes": 65536, "suite": "seq",
               "jobs": [1], "degraded": [0, 1], "seconds": 0.2}),
    );
    assert_eq!(st, 202, "{v}");
    let j = s.wait_job(v["job"].as_u64().unwrap());
    assert_eq!(j["state"], "done", "{j}");
    assert_eq!(j["kind"], "bench");
    let results = j["result"]["results"].as_array().unwrap();
    // seq read and seq write, healthy and one failed.
    assert_eq!(results.len(), 4, "{j}");
    for r in results {
        for k in [
            "level",
            "drives",
            "state",
            "workload",
            "bs_bytes",
            "jobs",
            "iodepth",
            "value",
            "unit",
            "raw_value",
            "ratio",
        ] {
            assert!(!r[k].is_null(), "{k} missing in {r}");
        }
        assert_eq!(r["level"], "raid5");
        assert!(r["value"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(j["result"]["table"]
        .as_str()
        .unwrap()
        .contains("raw drives"));

    // A served pool: its reads only, since writes would overwrite what it serves.
    let (st, v) = s.post(
        "/api/v1/bench",
        json!({"pool": "bp", "suite": "seq", "jobs": [1], "degraded": [0], "seconds": 0.1}),
    );
    assert_eq!(st, 202, "{v}");
    let j = s.wait_job(v["job"].as_u64().unwrap());
    assert_eq!(j["state"], "done", "{j}");
    let results = j["result"]["results"].as_array().unwrap();
    assert!(!results.is_empty());
    assert!(results.iter().all(|r| r["workload"] == "seq_read"), "{j}");
    let msg = refused(
        s.post("/api/v1/bench", json!({"pool": "bp", "suite": "mixed"})),
        400,
    );
    assert!(msg.contains("overwrite"), "{msg}");
    refused(
        s.post("/api/v1/bench", json!({"sim": "lots of drives"})),
        400,
    );
    refused(
        s.post("/api/v1/bench", json!({"sim": "4x100M", "jobs": [0]})),
        400,
    );
    let (_, p) = s.get("/api/v1/pools/bp");
    assert_eq!(p["state"], "online", "benching changed the pool: {p}");
}
