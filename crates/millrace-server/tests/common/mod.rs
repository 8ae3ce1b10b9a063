//! What the server's integration tests share: one test server's configuration, and starting it
//! and waiting for its URL. A test changes the fields it cares about with struct update syntax
//! (`ServeConfig { nvme: ..., ..common::config(&home) }`), so a new `ServeConfig` field is
//! added here once, not in every test file.

// Each test binary uses the part it needs.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use millrace_server::datapath::DataPathConfig;
use millrace_server::ServeConfig;
use serde_json::Value;

/// A server for `home` with the API on 127.0.0.1:0, no NVMe or NBD listener (NBD's Unix
/// socket is always there), no token, no TLS, the default HTTP limits and bench budget, and a
/// small data path: tests start many servers at once, so two cores and a 16 MiB pool each,
/// not faulted in.
pub fn config(home: &Path) -> ServeConfig {
    ServeConfig {
        home: home.to_path_buf(),
        api: "127.0.0.1:0".parse().unwrap(),
        nvme: Vec::new(),
        discovery_port: None,
        nvme_rdma: Vec::new(),
        nvme_tls: Default::default(),
        nbd_listen: None,
        token: None,
        tls: None,
        http: Default::default(),
        bench_memory: millrace_server::DEFAULT_BENCH_MEMORY,
        data_path: DataPathConfig {
            cores: Some(2),
            cpus: None,
            buffer_pool_bytes: Some(16 << 20),
            populate: Some(false),
        },
    }
}

/// Runs `cfg` in a thread and a runtime of its own (a server that stops with an error panics
/// there) and returns its URL once its server file names one other than `not`.
pub fn spawn(cfg: ServeConfig, not: Option<&str>) -> String {
    let home = cfg.home.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        if let Err(e) = rt.block_on(millrace_server::run(cfg)) {
            panic!("the server stopped: {e:#}");
        }
    });
    wait_url(&home, not)
}

/// The URL of the server for `home`, once its server file names one other than `not`;
/// panics after 30 s.
pub fn wait_url(home: &Path, not: Option<&str>) -> String {
    let sf = millrace_server::server_file(home);
    let t0 = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(&sf) {
            if let Ok(f) = serde_json::from_str::<millrace_server::ServerFile>(&text) {
                if Some(f.url.as_str()) != not {
                    return f.url;
                }
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the server did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `len` bytes of a pattern that differs with `seed` (xorshift), to write and check back.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An HTTP client for a test server's API: an error status is an answer, not an error; a call
/// takes 60 s at most.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// `method` (GET and DELETE without a body, PUT and POST with a JSON one) on `url` + `path`:
/// the status and the body as text.
pub fn call(
    agent: &ureq::Agent,
    url: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, String) {
    let url = format!("{url}{path}");
    let r = match (method, body) {
        ("GET", None) => agent.get(&url).call(),
        ("DELETE", None) => agent.delete(&url).call(),
        ("PUT", Some(b)) => agent.put(&url).send_json(&b),
        ("POST", Some(b)) => agent.post(&url).send_json(&b),
        (m, b) => panic!(
            "no {m} {} in these tests",
            if b.is_some() {
                "with a body"
            } else {
                "without a body"
            }
        ),
    };
    let mut r = r.expect("the server answers");
    (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
}

/// [`call`], the body as JSON (as a JSON string of its text where it is not JSON).
pub fn call_json(
    agent: &ureq::Agent,
    url: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let (status, text) = call(agent, url, method, path, body);
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}
