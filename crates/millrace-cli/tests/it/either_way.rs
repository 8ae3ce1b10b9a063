//! The CLI's commands work the same with and without a running server: a table of commands
//! runs in two homes holding the same pool, one with `millrace serve` running (the commands go
//! through its HTTP API) and one without (the CLI opens the pools itself), and each command
//! must succeed or fail alike, print the same (up to the pool's random ids and the folder's
//! name), and leave the same pools, volumes and exports behind.

use crate::common;
use std::path::{Path, PathBuf};

use crate::common::millrace;
use serde_json::Value;

/// The same pool in `dir`: six drive files, RAID 6, 64 KiB strips.
fn pool(dir: &Path) {
    let ds: Vec<PathBuf> = (0..6)
        .map(|i| dir.join(format!("drives/d{i}.img")))
        .collect();
    millrace(dir)
        .args([
            "pool", "create", "tank", "--level", "raid6", "--strip", "64k",
        ])
        .args(["--create", "32M"])
        .args(&ds)
        .assert()
        .success();
    std::fs::write(dir.join("data.bin"), common::pattern(3_000_000, 7)).unwrap();
}

/// What a command did: its exit, and its output with what differs between two homes masked
/// (the folder, random ids and creation times; a pool's event counter and clean flag, which
/// count how often it was opened; what the drive files take, which is the filesystem's to say).
#[derive(Debug, PartialEq)]
struct Outcome {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn mask_json(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for k in [
                "uuid",
                "created_unix",
                "events",
                "clean",
                "member_allocated_bytes",
            ] {
                if m.contains_key(k) {
                    m.insert(k.into(), Value::String("(masked)".into()));
                }
            }
            m.values_mut().for_each(mask_json);
        }
        Value::Array(a) => a.iter_mut().for_each(mask_json),
        _ => {}
    }
}

fn run(dir: &Path, args: &[&str]) -> Outcome {
    let out = millrace(dir)
        .env_remove("MILLRACE_SERVER")
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).replace(&dir.display().to_string(), "DIR");
    let mut stdout = text(&out.stdout);
    if args.contains(&"--json") && out.status.success() {
        let mut v: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{args:?} printed no JSON ({e}): {stdout}"));
        mask_json(&mut v);
        stdout = serde_json::to_string_pretty(&v).unwrap();
    }
    // The engine's log lines (` WARN member 5 ... marked faulty`) go to the server's log when
    // one runs and to the terminal without one: what the command itself says is compared.
    let stderr = (text(&out.stderr).lines())
        .filter(|l| !l.starts_with(" WARN ") && !l.starts_with(" ERROR "))
        .map(|l| format!("{l}\n"))
        .collect();
    Outcome {
        ok: out.status.success(),
        stdout,
        stderr,
    }
}

/// Commands in order, each with whether it must succeed. Exports added as text say whether
/// they serve now or at the next start, so those are run with --json, which says the same.
const TABLE: &[(&[&str], bool)] = &[
    (&["volume", "list"], true),
    (&["volume", "create", "tank/a", "--size", "5000000"], true),
    (
        &["volume", "create", "tank/b", "--size", "1M", "--json"],
        true,
    ),
    (&["volume", "create", "tank/b", "--size", "1M"], false),
    (&["volume", "create", "nosuch/b", "--size", "1M"], false),
    (&["volume", "list"], true),
    (&["volume", "list", "tank", "--json"], true),
    (&["volume", "show", "tank/a"], true),
    (&["volume", "show", "tank/nosuch"], false),
    (&["volume", "grow", "tank/a", "--size", "8M"], false),
    (&["volume", "delete", "tank/b"], true),
    (
        &["volume", "grow", "tank/a", "--size", "8M", "--json"],
        true,
    ),
    (&["export", "nvme", "add", "tank/a"], false),
    (&["export", "nbd", "add", "tank/a", "--json"], true),
    (&["export", "nbd", "add", "tank/a", "--json"], false),
    (&["volume", "delete", "tank/a"], false),
    (&["export", "nbd", "list", "--json"], true),
    (&["export", "nbd", "remove", "tank/a"], true),
    (&["export", "nbd", "remove", "tank/a"], false),
    (&["export", "list"], true),
    (&["export", "list", "--json"], true),
    (
        &["volume", "create", "tank/c", "--size", "2M", "--json"],
        true,
    ),
    (&["volume", "list", "--json"], true),
    (&["pool", "list"], true),
    (&["pool", "list", "--json"], true),
    (&["status", "--json"], true),
    (&["pool", "show", "tank", "--json"], true),
    (&["pool", "show", "nosuch"], false),
    (
        &[
            "io", "write", "tank", "--offset", "40M", "--input", "data.bin",
        ],
        true,
    ),
    (
        &[
            "io", "write", "tank", "--offset", "1000G", "--input", "data.bin",
        ],
        false,
    ),
    (
        &["io", "read", "tank", "--offset", "41M", "--length", "70000"],
        true,
    ),
    (
        &["io", "read", "tank", "--offset", "40M", "--length", "1000G"],
        false,
    ),
    (
        &["io", "read", "nosuch", "--offset", "0", "--length", "1"],
        false,
    ),
    (&["pool", "scrub", "tank", "--json"], true),
    (&["pool", "scrub", "nosuch"], false),
    (&["pool", "rebuild", "tank"], true),
    (&["pool", "fail", "tank", "drives/d5.img"], true),
    (&["pool", "show", "tank", "--json"], true),
    (&["pool", "fail", "tank", "drives/nosuch.img"], false),
    (
        &["io", "read", "tank", "--offset", "41M", "--length", "70000"],
        true,
    ),
    (
        &["pool", "replace", "tank", "drives/d5.img", "nosuch.img"],
        false,
    ),
    (
        &[
            "pool", "create", "tank", "--level", "raid1", "--create", "16M",
        ],
        false,
    ),
    (
        &[
            "pool", "create", "tank", "--level", "raid1", "--create", "16M", "o0.img", "o1.img",
        ],
        false,
    ),
    (
        &[
            "pool", "create", "other", "--level", "raid1", "--create", "16M", "o0.img", "o1.img",
            "--json",
        ],
        true,
    ),
    (&["pool", "show", "other", "--json"], true),
    (&["pool", "destroy", "other"], false),
    (&["pool", "destroy", "other", "--yes"], true),
    (&["pool", "show", "other"], false),
    (&["pool", "import", "o0.img", "o1.img"], false),
    (&["pool", "list", "--json"], true),
];

#[test]
fn commands_work_the_same_with_and_without_a_server() {
    let offline = tempfile::tempdir().unwrap();
    let served = tempfile::tempdir().unwrap();
    pool(offline.path());
    pool(served.path());
    let server = common::serve(served.path());
    for (args, ok) in TABLE {
        let a = run(offline.path(), args);
        let b = run(served.path(), args);
        // `export nbd list --json` shows whether the export serves: the one difference the
        // two ways are meant to have. Its refusal-free run is compared without that field.
        if args == &["export", "nbd", "list", "--json"] {
            assert!(a.ok && b.ok, "{args:?} failed: {a:?} {b:?}");
            let strip = |s: &str| {
                let mut v: Value = serde_json::from_str(s).unwrap();
                for e in v["nbd"].as_array_mut().unwrap() {
                    e.as_object_mut().unwrap().remove("serving");
                }
                v
            };
            assert_eq!(strip(&a.stdout), strip(&b.stdout), "{args:?}");
            continue;
        }
        assert_eq!(a.ok, *ok, "{args:?} without a server: {a:?}");
        assert_eq!(
            a, b,
            "{args:?} differs without (left) and with (right) a server"
        );
    }
    // The same effect: what each home holds, read through the other way too.
    drop(server);
    let left = run(offline.path(), &["volume", "list", "--json"]);
    let right = run(served.path(), &["volume", "list", "--json"]);
    assert!(left.ok && right.ok);
    assert_eq!(left.stdout, right.stdout);
    let names: Vec<Value> = serde_json::from_str::<Value>(&left.stdout)
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].clone())
        .collect();
    assert_eq!(names, ["a", "c"], "{}", left.stdout);
    let left = run(offline.path(), &["pool", "show", "tank", "--json"]);
    let right = run(served.path(), &["pool", "show", "tank", "--json"]);
    assert!(left.ok && right.ok);
    assert_eq!(left.stdout, right.stdout);
    assert!(
        left.stdout.contains(r#""state": "degraded""#),
        "{}",
        left.stdout
    );
    // The bytes written with `io write` read back, degraded, in both homes.
    for dir in [offline.path(), served.path()] {
        let args = [
            "io", "read", "tank", "--offset", "40M", "--length", "3000000",
        ];
        let out = run(dir, &[&args[..], &["--output", "back.bin"]].concat());
        assert!(out.ok, "{out:?}");
        let back = std::fs::read(dir.join("back.bin")).unwrap();
        assert!(
            back == common::pattern(3_000_000, 7),
            "{} read back other bytes",
            dir.display()
        );
    }
}
