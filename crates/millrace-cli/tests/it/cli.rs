//! The CLI end to end on real drive files: what a user types, what they get back.

use crate::common::{millrace, pattern};
use std::path::{Path, PathBuf};

use predicates::str::contains;
use serde_json::Value;

fn drives(dir: &Path, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| dir.join(format!("drives/d{i}.img")))
        .collect()
}

fn create(dir: &Path, name: &str, level: &str, extra: &[&str], ds: &[PathBuf]) -> Value {
    let mut c = millrace(dir);
    c.args([
        "pool", "create", name, "--level", level, "--strip", "64k", "--create", "64M", "--json",
    ]);
    c.args(extra);
    c.args(ds);
    let out = c.assert().success().get_output().stdout.clone();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn create_write_read_show_import() {
    let t = tempfile::tempdir().unwrap();
    let ds = drives(t.path(), 6);
    let info = create(t.path(), "tank", "raid6", &[], &ds);
    for key in [
        "name",
        "uuid",
        "level",
        "strip_bytes",
        "group_size",
        "size_bytes",
        "full_stripe_bytes",
        "state",
        "members",
    ] {
        assert!(info.get(key).is_some(), "pool show --json lacks {key}");
    }
    assert_eq!(info["level"], "raid6");
    assert_eq!(info["strip_bytes"], 65536);
    assert_eq!(info["full_stripe_bytes"], 4 * 65536);
    assert_eq!(info["state"], "online");
    let members = info["members"].as_array().unwrap();
    assert_eq!(members.len(), 6);
    for m in members {
        assert!(m["path"].as_str().unwrap().ends_with(".img"));
        assert_eq!(m["state"], "online");
        assert!(m["data_offset_bytes"].as_u64().unwrap() >= 8192);
    }

    // Unaligned offset, odd length: bytes read back equal bytes written.
    let data = pattern(1_000_003, 1);
    std::fs::write(t.path().join("in.bin"), &data).unwrap();
    millrace(t.path())
        .args([
            "io", "write", "tank", "--offset", "12345", "--input", "in.bin",
        ])
        .assert()
        .success();
    let out = millrace(t.path())
        .args([
            "io", "read", "tank", "--offset", "12345", "--length", "1000003",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(out == data, "read back differs from what was written");

    // Stdin works too.
    millrace(t.path())
        .args(["io", "write", "tank", "--offset", "7"])
        .write_stdin(b"hello".to_vec())
        .assert()
        .success();
    let out = millrace(t.path())
        .args(["io", "read", "tank", "--offset", "7", "--length", "5"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert_eq!(out, b"hello");

    millrace(t.path())
        .args(["pool", "show", "tank"])
        .assert()
        .success()
        .stdout(contains("raid6"))
        .stdout(contains("online"));

    // Forget everything but the drives, then find the pool again from them alone.
    std::fs::remove_dir_all(t.path().join("home")).unwrap();
    millrace(t.path())
        .args(["pool", "show", "tank"])
        .assert()
        .failure()
        .stderr(contains("no pool named 'tank'"));
    let mut c = millrace(t.path());
    c.args(["pool", "import"]).args(&ds);
    c.assert()
        .success()
        .stdout(contains("imported pool 'tank'"));
    let out = millrace(t.path())
        .args([
            "io", "read", "tank", "--offset", "12345", "--length", "1000003",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(out == data, "data differs after import");
}

#[test]
fn every_level_round_trips_through_the_cli() {
    let t = tempfile::tempdir().unwrap();
    for (i, (level, n, extra)) in [
        ("raid0", 3, vec![]),
        ("raid1", 2, vec![]),
        ("raid10", 4, vec![]),
        ("raid5", 4, vec![]),
        ("raid50", 6, vec!["--group", "3"]),
        ("raid60", 8, vec!["--group", "4"]),
    ]
    .into_iter()
    .enumerate()
    {
        let dir = t.path().join(level);
        let ds = drives(&dir, n);
        let name = format!("p{i}");
        create(t.path(), &name, level, &extra, &ds);
        let data = pattern(300_000, i as u32);
        millrace(t.path())
            .args(["io", "write", &name, "--offset", "4097"])
            .write_stdin(data.clone())
            .assert()
            .success();
        let out = millrace(t.path())
            .args([
                "io", "read", &name, "--offset", "4097", "--length", "300000",
            ])
            .assert()
            .success()
            .get_output()
            .stdout
            .clone();
        assert!(out == data, "{level}: read back differs");
    }
    millrace(t.path())
        .args(["status"])
        .assert()
        .success()
        .stdout(contains("raid60"));
}

fn snapshot(paths: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    paths.iter().map(|p| std::fs::read(p).ok()).collect()
}

#[test]
fn bad_input_is_refused_and_nothing_is_written() {
    let t = tempfile::tempdir().unwrap();
    let ds = drives(t.path(), 4);
    create(t.path(), "first", "raid5", &[], &ds[..3]);
    std::fs::write(&ds[3], vec![0u8; 64 << 20]).unwrap();
    let before = snapshot(&ds);

    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--level", "raid6", "a", "b", "c"]
                .into_iter()
                .map(String::from)
                .collect(),
            "at least 4 drives",
        ),
        (
            vec!["--level", "raid7", "a"]
                .into_iter()
                .map(String::from)
                .collect(),
            "unknown RAID level",
        ),
        (
            vec!["--level", "raid5", "--strip", "3000", "a", "b", "c"]
                .into_iter()
                .map(String::from)
                .collect(),
            "power of two",
        ),
        (
            vec![
                "--level".into(),
                "raid50".into(),
                "--group".into(),
                "3".into(),
                ds[3].display().to_string(),
                "x1".into(),
                "x2".into(),
                "x3".into(),
                "x4".into(),
                "x5".into(),
                "x6".into(),
                "x7".into(),
            ],
            "does not divide",
        ),
        (
            vec![
                "--level".into(),
                "raid1".into(),
                ds[3].display().to_string(),
                ds[3].display().to_string(),
            ],
            "given twice",
        ),
        (
            vec![
                "--level".into(),
                "raid1".into(),
                ds[3].display().to_string(),
                ds[0].display().to_string(),
            ],
            "already belongs to pool 'first'",
        ),
    ];
    for (args, want) in cases {
        let mut c = millrace(t.path());
        c.args(["pool", "create", "second", "--create", "64M"])
            .args(&args);
        c.assert().failure().stderr(contains(want));
    }
    // Nothing was written to any drive, and no stray drive files were made.
    assert!(snapshot(&ds) == before, "a refused create changed a drive");
    for x in ["a", "b", "c", "x1", "x5"] {
        assert!(
            !t.path().join(x).exists(),
            "a refused create left {x} behind"
        );
    }

    // A drive too small for its metadata and one strip.
    let small = t.path().join("small.img");
    std::fs::write(&small, vec![0u8; 100 << 10]).unwrap();
    let mut c = millrace(t.path());
    c.args(["pool", "create", "second", "--level", "raid1"])
        .arg(&small)
        .arg(&ds[3]);
    c.assert().failure().stderr(contains("too small"));
    assert!(snapshot(&ds) == before);
    assert!(std::fs::read(&small).unwrap().iter().all(|&b| b == 0));

    // A drive with foreign content is not claimed without --force.
    let mut foreign = vec![0u8; 64 << 20];
    foreign[..4].copy_from_slice(b"XFSB");
    std::fs::write(&ds[3], &foreign).unwrap();
    let f = t.path().join("f.img");
    let mut c = millrace(t.path());
    c.args([
        "pool", "create", "second", "--level", "raid1", "--create", "64M",
    ])
    .arg(&ds[3])
    .arg(&f);
    c.assert().failure().stderr(contains("not blank"));

    // Reads past the end and unknown pools.
    millrace(t.path())
        .args(["io", "read", "first", "--offset", "0", "--length", "1T"])
        .assert()
        .failure()
        .stderr(contains("past the end"));
    millrace(t.path())
        .args(["pool", "show", "nosuch"])
        .assert()
        .failure()
        .stderr(contains("no pool named 'nosuch'"));
}

#[test]
fn stale_and_corrupt_members_are_reported_not_trusted() {
    let t = tempfile::tempdir().unwrap();
    let ds = drives(t.path(), 4);
    create(t.path(), "tank", "raid5", &[], &ds);
    // Keep an old copy of member 1, then change the pool so its event counter moves on.
    let old = std::fs::read(&ds[1]).unwrap();
    millrace(t.path())
        .args(["io", "write", "tank", "--offset", "0"])
        .write_stdin(pattern(200_000, 9))
        .assert()
        .success();
    std::fs::write(&ds[1], &old).unwrap();
    let mut c = millrace(t.path());
    c.args(["pool", "import", "--json"]).args(&ds);
    let out = c
        .assert()
        .success()
        .stderr(contains("stale"))
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v[0]["members"][1]["state"], "faulty");
    assert_eq!(v[0]["state"], "degraded");
    // Data still reads right: the stale member is not used.
    let got = millrace(t.path())
        .args(["io", "read", "tank", "--offset", "0", "--length", "200000"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(got == pattern(200_000, 9));

    // A damaged superblock is reported and ignored, not guessed at.
    let mut bytes = std::fs::read(&ds[2]).unwrap();
    for b in &mut bytes[100..120] {
        *b ^= 0xff;
    }
    for b in &mut bytes[4096 + 100..4096 + 120] {
        *b ^= 0xff;
    }
    std::fs::write(&ds[2], &bytes).unwrap();
    let mut c = millrace(t.path());
    c.args(["pool", "import"]).args(&ds);
    c.assert().stderr(contains("corrupt"));
}

/// A drive another process holds is not taken for missing: the command says it is in use and
/// changes nothing.
#[test]
fn a_drive_in_use_elsewhere_is_refused_not_dropped() {
    let t = tempfile::tempdir().unwrap();
    let ds = drives(t.path(), 4);
    create(t.path(), "tank", "raid5", &[], &ds);
    let before: Vec<Vec<u8>> = ds
        .iter()
        .map(|p| std::fs::read(p).unwrap()[..8192].to_vec())
        .collect();
    let mut holder = std::process::Command::new("flock")
        .arg("-x")
        .arg(&ds[1])
        .args(["sleep", "5"])
        .spawn()
        .expect("flock (util-linux) runs");
    std::thread::sleep(std::time::Duration::from_millis(300));
    millrace(t.path())
        .args(["pool", "show", "tank"])
        .assert()
        .failure()
        .stderr(contains("in use by another process"));
    // flock hands its lock to sleep: let it run out.
    holder.wait().unwrap();
    let after: Vec<Vec<u8>> = ds
        .iter()
        .map(|p| std::fs::read(p).unwrap()[..8192].to_vec())
        .collect();
    assert!(before == after, "a refused command changed a superblock");
    millrace(t.path())
        .args(["pool", "show", "tank"])
        .assert()
        .success()
        .stdout(contains("online"));
}

/// `millrace serve` runs the millrace-server program beside `millrace`; where it is missing the
/// command says where it looked and how to get it, and `serve --help` is the server's own.
#[test]
fn serve_runs_the_server_program_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("millrace");
    std::fs::copy(assert_cmd::cargo::cargo_bin("millrace"), &alone).unwrap();
    let out = std::process::Command::new(&alone)
        .env("MILLRACE_HOME", dir.path().join("home"))
        .args(["serve", "--api", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let missing = dir.path().join("millrace-server");
    assert!(
        err.contains(&format!("{} is missing", missing.display()))
            && err.contains("cargo build --workspace --bins"),
        "{err}"
    );
    millrace(dir.path())
        .args(["serve", "--help"])
        .assert()
        .success()
        .stdout(contains("Usage: millrace serve"))
        .stdout(contains("--nvme-rdma"));
}
