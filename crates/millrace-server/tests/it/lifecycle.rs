//! Starting and stopping the server, and the pool cache under concurrent changes: a live
//! server is never started twice while a dead one's record blocks nothing (#16 item 10); a
//! start that cannot bind its ports leaves its pools clean (7b); concurrent creates keep every
//! entry of pools.json and refuse the duplicate name (7).

use crate::common;
use std::path::{Path, PathBuf};

use millrace_array::superblock::{Superblock, SLOT_BYTES};
use millrace_server::model::CreatePool;

/// A server for `home` with its API on `api`.
fn config(home: &Path, api: &str) -> millrace_server::ServeConfig {
    millrace_server::ServeConfig {
        api: api.parse().unwrap(),
        ..common::config(home)
    }
}

/// Starts a server for `home` in a thread of its own and waits until its server file names
/// a URL other than `not`.
fn start(home: &Path, not: Option<&str>) -> String {
    common::spawn(config(home, "127.0.0.1:0"), not)
}

fn create_req(name: &str, drives: &[PathBuf]) -> CreatePool {
    CreatePool {
        name: name.into(),
        level: "raid1".into(),
        strip_bytes: None,
        group: None,
        drives: drives.to_vec(),
        create_size_bytes: Some(32 << 20),
        data_offset_bytes: None,
        force: false,
    }
}

fn superblock(drive: &Path) -> Option<Superblock> {
    let b = std::fs::read(drive).ok()?;
    Superblock::decode_slots(b.get(..2 * SLOT_BYTES)?).ok()
}

#[test]
fn a_dead_servers_record_blocks_nothing_and_a_live_one_is_not_started_twice() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // A record left by a server that died, its pid now another live process's.
    let mut other = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let stale = millrace_server::ServerFile {
        url: "http://127.0.0.1:9".into(),
        pid: other.id(),
        nbd_socket: home.join("nbd.sock"),
        tls_cert: None,
    };
    std::fs::write(
        millrace_server::server_file(&home),
        serde_json::to_vec(&stale).unwrap(),
    )
    .unwrap();
    // The CLI asks this before it uses the record: nothing runs here.
    assert!(!millrace_server::server_running(&home));
    let url = start(&home, Some(&stale.url));
    let _ = other.kill();
    let _ = other.wait();
    assert!(millrace_server::server_running(&home));
    // A second server on the same home is refused while the first lives.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt
        .block_on(millrace_server::run(config(&home, "127.0.0.1:0")))
        .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("already serves") && msg.contains(&url),
        "{msg}"
    );
}

#[test]
fn a_start_that_cannot_bind_leaves_its_pools_clean() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let drives: Vec<PathBuf> = (0..3).map(|i| dir.path().join(format!("d{i}"))).collect();
    let state = millrace_server::State::open_offline(&home).unwrap();
    let mut req = create_req("tank", &drives);
    req.level = "raid5".into();
    state.create_pool(req).unwrap();
    state.close().unwrap();
    assert!(drives.iter().all(|d| superblock(d).unwrap().clean));
    // The API's address is taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let e = rt
        .block_on(millrace_server::run(config(
            &home,
            &taken.local_addr().unwrap().to_string(),
        )))
        .unwrap_err();
    assert!(
        format!("{e:#}").contains("cannot listen for the API"),
        "{e:#}"
    );
    for d in &drives {
        let sb = superblock(d).unwrap();
        assert!(
            sb.clean,
            "{} was left in use by a start that failed",
            d.display()
        );
    }
    assert!(!millrace_server::server_running(&home));
}

#[test]
fn concurrent_creates_keep_every_entry_and_refuse_the_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // Each State stands for a process of its own (a server, or the CLI offline): each opens
    // the (empty) cache first, then all create at once.
    let names: Vec<String> = (0..8)
        .map(|i| format!("p{i}"))
        .chain(["dup".to_string(), "dup".to_string()])
        .collect();
    let states: Vec<millrace_server::State> = names
        .iter()
        .map(|_| millrace_server::State::open_offline(&home).unwrap())
        .collect();
    let barrier = std::sync::Barrier::new(names.len());
    let results: Vec<(String, Vec<PathBuf>, Result<(), String>)> = std::thread::scope(|sc| {
        let handles: Vec<_> = names
            .iter()
            .zip(&states)
            .enumerate()
            .map(|(i, (name, state))| {
                let drives: Vec<PathBuf> = (0..2)
                    .map(|k| dir.path().join(format!("t{i}-{k}")))
                    .collect();
                let barrier = &barrier;
                sc.spawn(move || {
                    barrier.wait();
                    let r = state
                        .create_pool(create_req(name, &drives))
                        .map(|_| ())
                        .map_err(|e| format!("{} {}", e.status, e.message));
                    (name.clone(), drives, r)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for s in &states {
        s.close().unwrap();
    }
    let cache = millrace_array::Cache::load(&home).unwrap();
    let mut cached: Vec<&String> = cache.pools.keys().collect();
    cached.sort();
    assert_eq!(cached.len(), 9, "pools.json lost entries: {cached:?}");
    for (name, _, r) in &results {
        if name != "dup" {
            assert!(r.is_ok(), "{name}: {r:?}");
        }
    }
    let dups: Vec<_> = results.iter().filter(|(n, _, _)| n == "dup").collect();
    let won: Vec<_> = dups.iter().filter(|(_, _, r)| r.is_ok()).collect();
    assert_eq!(won.len(), 1, "both creates of one name succeeded: {dups:?}");
    let lost = dups.iter().find(|(_, _, r)| r.is_err()).unwrap();
    let msg = lost.2.as_ref().unwrap_err();
    assert!(
        msg.starts_with("409") && msg.contains("already exists"),
        "{msg}"
    );
    // The loser left nothing on its drives that an import would take for a pool.
    assert!(lost.1.iter().all(|d| superblock(d).is_none()));
    assert_eq!(
        cache.pools["dup"].members[0],
        std::path::absolute(&won[0].1[0]).unwrap()
    );
}
