//! `millrace bench` through the service layer, over the real binary: a simulated pool and a
//! pool with no server (here, in this process), and a served pool (by the server, reads only).
//! Each run must print its table, write its JSON and PNG, and refuse what would overwrite a
//! served pool or rewrite a member without --write.

use std::path::Path;

use crate::common::{millrace, serve};
use predicates::str::contains;
use serde_json::Value;

const QUICK: &[&str] = &["--jobs", "1", "--seconds", "0.1", "--bs", "256k"];

fn results(path: &Path) -> Vec<Value> {
    let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    v["results"].as_array().expect("a results list").clone()
}

fn is_png(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.starts_with(b"\x89PNG\r\n\x1a\n"))
}

fn make_pool(dir: &Path) {
    millrace(dir)
        .args([
            "pool", "create", "tank", "--level", "raid5", "--create", "24M",
        ])
        .args(["d0.img", "d1.img", "d2.img", "d3.img"])
        .assert()
        .success();
}

#[test]
fn a_simulated_pool_is_benched_with_its_table_json_and_plot() {
    let d = tempfile::tempdir().unwrap();
    let out = millrace(d.path())
        .args([
            "bench", "--sim", "4x400M", "--level", "raid5", "--suite", "seq",
        ])
        .args(["--degraded", "0,1,2", "--json", "r.json", "--plot", "r.png"])
        .args(QUICK)
        .assert()
        .success()
        .stderr(contains("states with [2] failed drives skipped"))
        .get_output()
        .stdout
        .clone();
    let table = String::from_utf8(out).unwrap();
    assert!(
        table.contains("raid5"),
        "a table for the raid5 pool:\n{table}"
    );
    let r = results(&d.path().join("r.json"));
    let states: std::collections::BTreeSet<&str> =
        r.iter().map(|p| p["state"].as_str().unwrap()).collect();
    assert_eq!(states.len(), 2, "healthy and one failed drive: {states:?}");
    assert!(
        r.iter().any(|p| p["workload"] == "seq_write"),
        "writes run on a sim"
    );
    assert!(r
        .iter()
        .all(|p| p["jobs"] == 1 && p["value"].as_f64().unwrap() > 0.0));
    assert!(is_png(&d.path().join("r.png")), "a PNG plot");
}

#[test]
fn a_pool_with_no_server_runs_its_writes_only_when_asked() {
    let d = tempfile::tempdir().unwrap();
    make_pool(d.path());
    millrace(d.path())
        .args([
            "bench",
            "tank",
            "--suite",
            "seq",
            "--degraded",
            "0",
            "--json",
            "a.json",
        ])
        .args(QUICK)
        .assert()
        .success()
        .stderr(contains("write workloads skipped"));
    let r = results(&d.path().join("a.json"));
    assert!(!r.is_empty() && r.iter().all(|p| p["workload"] == "seq_read"));
    millrace(d.path())
        .args([
            "bench",
            "tank",
            "--suite",
            "seq",
            "--degraded",
            "0",
            "--rebuild",
        ])
        .args(QUICK)
        .assert()
        .failure()
        .stderr(contains("a rebuild rewrites a member"));
    millrace(d.path())
        .args([
            "bench",
            "tank",
            "--suite",
            "seq",
            "--degraded",
            "0",
            "--write",
        ])
        .args(["--json", "b.json"])
        .args(QUICK)
        .assert()
        .success();
    let r = results(&d.path().join("b.json"));
    assert!(
        r.iter().any(|p| p["workload"] == "seq_write"),
        "--write runs writes"
    );
}

#[test]
fn a_served_pool_is_benched_by_the_server_reads_only() {
    let d = tempfile::tempdir().unwrap();
    make_pool(d.path());
    let _s = serve(d.path());
    millrace(d.path())
        .args([
            "bench",
            "tank",
            "--suite",
            "seq",
            "--degraded",
            "0",
            "--write",
        ])
        .args(QUICK)
        .assert()
        .failure()
        .stderr(contains("is served by `millrace serve`"));
    millrace(d.path())
        .args([
            "bench",
            "tank",
            "--suite",
            "seq",
            "--degraded",
            "0",
            "--rebuild",
        ])
        .args(QUICK)
        .assert()
        .failure()
        .stderr(contains("no server running"));
    millrace(d.path())
        .args(["bench", "tank", "--suite", "seq", "--degraded", "0"])
        .args(["--json", "s.json", "--plot", "s.png"])
        .args(QUICK)
        .assert()
        .success()
        .stderr(contains("the server benches pool tank's read workloads"));
    let r = results(&d.path().join("s.json"));
    assert!(!r.is_empty() && r.iter().all(|p| p["workload"] == "seq_read"));
    assert!(
        is_png(&d.path().join("s.png")),
        "a served bench is plotted too"
    );
    // A simulated pool is still benched by this process while a server runs.
    millrace(d.path())
        .args([
            "bench", "--sim", "4x400M", "--level", "raid5", "--suite", "seq",
        ])
        .args(["--degraded", "0", "--json", "m.json"])
        .args(QUICK)
        .assert()
        .success();
    assert!(results(&d.path().join("m.json"))
        .iter()
        .any(|p| p["workload"] == "seq_write"));
}
