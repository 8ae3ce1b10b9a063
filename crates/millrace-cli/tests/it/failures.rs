//! Drive failures through the CLI on drive files: degraded reads, hot spares, replacement,
//! rebuild (also interrupted by SIGKILL and resumed), and scrub finding and fixing silent
//! corruption.

use crate::common::{millrace, pattern, scrub};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use millrace_io::cannot_run;
use predicates::str::contains;
use serde_json::Value;

fn show(dir: &Path, name: &str) -> Value {
    let out = millrace(dir)
        .args(["pool", "show", name, "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&out).unwrap()
}

fn read_back(dir: &Path, name: &str, off: u64, len: usize) -> Vec<u8> {
    millrace(dir)
        .args([
            "io",
            "read",
            name,
            "--offset",
            &off.to_string(),
            "--length",
            &len.to_string(),
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone()
}

fn setup(dir: &Path, n: usize, size: &str) -> (Vec<PathBuf>, Vec<u8>) {
    let ds: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("d{i}.img"))).collect();
    let mut c = millrace(dir);
    c.args([
        "pool",
        "create",
        "tank",
        "--level",
        "raid6",
        "--strip",
        "64k",
        "--create",
        size,
        "--data-offset",
        "1M",
    ])
    .args(&ds);
    c.assert().success();
    let data = pattern(3_000_000, 5);
    millrace(dir)
        .args(["io", "write", "tank", "--offset", "777"])
        .write_stdin(data.clone())
        .assert()
        .success();
    (ds, data)
}

#[test]
fn fail_spare_replace_rebuild_scrub() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let (ds, data) = setup(dir, 6, "32M");

    millrace(dir)
        .args(["pool", "fail", "tank"])
        .arg(&ds[2])
        .assert()
        .success()
        .stdout(contains("degraded"));
    let v = show(dir, "tank");
    assert_eq!(v["state"], "degraded");
    assert_eq!(v["members"][2]["state"], "faulty");
    assert!(
        read_back(dir, "tank", 777, data.len()) == data,
        "degraded read differs"
    );
    // Writes keep working degraded.
    let more = pattern(200_000, 6);
    millrace(dir)
        .args(["io", "write", "tank", "--offset", "5000000"])
        .write_stdin(more.clone())
        .assert()
        .success();

    // A spare added while a member is out takes its place and is rebuilt at once.
    millrace(dir)
        .args(["pool", "spare", "add", "tank"])
        .arg(dir.join("s0.img"))
        .assert()
        .failure()
        .stderr(contains("cannot open"));
    std::fs::write(dir.join("s0.img"), vec![0u8; 32 << 20]).unwrap();
    millrace(dir)
        .args(["pool", "spare", "add", "tank"])
        .arg(dir.join("s0.img"))
        .assert()
        .success()
        .stdout(contains("rebuild finished"));
    let v = show(dir, "tank");
    assert_eq!(v["state"], "online");
    assert!(v["members"][2]["path"]
        .as_str()
        .unwrap()
        .ends_with("s0.img"));

    // Replace a healthy member; then two failures at once are survived, a third refused.
    millrace(dir)
        .args(["pool", "replace", "tank"])
        .arg(&ds[4])
        .arg(dir.join("n4.img"))
        .assert()
        .failure()
        .stderr(contains("cannot open"));
    std::fs::write(dir.join("n4.img"), vec![0u8; 32 << 20]).unwrap();
    millrace(dir)
        .args(["pool", "replace", "tank"])
        .arg(&ds[4])
        .arg(dir.join("n4.img"))
        .assert()
        .success();
    assert_eq!(show(dir, "tank")["state"], "online");
    millrace(dir)
        .args(["pool", "fail", "tank"])
        .arg(&ds[0])
        .assert()
        .success();
    millrace(dir)
        .args(["pool", "fail", "tank"])
        .arg(&ds[1])
        .assert()
        .success();
    millrace(dir)
        .args(["pool", "fail", "tank"])
        .arg(&ds[3])
        .assert()
        .failure()
        .stderr(contains("offline"));
    assert!(
        read_back(dir, "tank", 777, data.len()) == data,
        "read with two drives out differs"
    );
    assert!(read_back(dir, "tank", 5_000_000, more.len()) == more);

    // Bring it back to full health, then check every stripe.
    for (old, new) in [(0, "n0.img"), (1, "n1.img")] {
        std::fs::write(dir.join(new), vec![0u8; 32 << 20]).unwrap();
        millrace(dir)
            .args(["pool", "replace", "tank"])
            .arg(&ds[old])
            .arg(dir.join(new))
            .assert()
            .success();
    }
    let clean = scrub(dir, "tank");
    assert_eq!(clean["mismatches"], 0);
    assert!(clean["rows_checked"].as_u64().unwrap() > 100);

    // Silent corruption: a drive returns wrong data without an error. Scrub finds the strip
    // from P and Q, repairs it, and the data reads right again.
    let victim = dir.join("d3.img");
    let mut bytes = std::fs::read(&victim).unwrap();
    let at = (1 << 20) + 64 * 1024 * 5 + 100;
    let original = bytes[at..at + 3000].to_vec();
    for b in &mut bytes[at..at + 3000] {
        *b ^= 0x5a;
    }
    std::fs::write(&victim, &bytes).unwrap();
    let rep = scrub(dir, "tank");
    assert_eq!(rep["mismatches"], 1, "{rep}");
    let rep = millrace(dir)
        .args(["pool", "scrub", "tank", "--repair", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let rep: Value = serde_json::from_slice(&rep).unwrap();
    assert_eq!(rep["repaired"], 1, "{rep}");
    let rep = scrub(dir, "tank");
    assert_eq!(rep["mismatches"], 0, "{rep}");
    assert!(
        std::fs::read(&victim).unwrap()[at..at + 3000] == original[..],
        "the corrupt strip was not restored"
    );
    assert!(
        read_back(dir, "tank", 777, data.len()) == data,
        "data differs after repair"
    );
}

#[test]
fn rebuild_killed_with_sigkill_resumes_from_its_checkpoint() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let (ds, data) = setup(dir, 5, "64M");
    millrace(dir)
        .args(["pool", "fail", "tank"])
        .arg(&ds[1])
        .assert()
        .success();
    std::fs::write(dir.join("n1.img"), vec![0u8; 64 << 20]).unwrap();
    // A slow rebuild (4 MiB/s), killed part way.
    let bin = assert_cmd::cargo::cargo_bin("millrace");
    let mut child = std::process::Command::new(&bin)
        .env("MILLRACE_HOME", dir.join("home"))
        .current_dir(dir)
        .args(["pool", "replace", "tank"])
        .arg(&ds[1])
        .arg(dir.join("n1.img"))
        .args(["--rate", "4M"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(3500));
    child.kill().unwrap();
    child.wait().unwrap();
    let v = show(dir, "tank");
    assert_eq!(v["state"], "rebuilding", "{v}");
    let done = v["rebuild"]["rows_done"].as_u64().unwrap();
    let total = v["rebuild"]["rows_total"].as_u64().unwrap();
    assert!(done > 0 && done < total, "checkpoint {done} of {total}");
    // Reads are right while half rebuilt.
    assert!(read_back(dir, "tank", 777, data.len()) == data);
    millrace(dir)
        .args(["pool", "rebuild", "tank"])
        .assert()
        .success()
        .stdout(contains("rebuild finished"));
    assert_eq!(show(dir, "tank")["state"], "online");
    let rep = scrub(dir, "tank");
    assert_eq!(rep["mismatches"], 0, "{rep}");
    // Now the old members alone (without n1) must still hold everything: fail another drive.
    millrace(dir)
        .args(["pool", "fail", "tank"])
        .arg(&ds[3])
        .assert()
        .success();
    millrace(dir)
        .args(["pool", "fail", "tank"])
        .arg(&ds[4])
        .assert()
        .success();
    assert!(
        read_back(dir, "tank", 777, data.len()) == data,
        "the rebuilt drive holds wrong data"
    );
}

/// `millrace io write` killed with SIGKILL at random moments, on a healthy and on a degraded
/// RAID6: the next command finds the pool unclean, replays its journal and resyncs, and then
/// every earlier write reads back exactly, every sector of the killed write holds its old or
/// its new content, and scrub finds parity consistent. Writes start at unaligned offsets, so a
/// sector split between two of the command's pieces would show (it once did, about one
/// degraded round in thirty); seven of the ten rounds run degraded.
#[test]
fn killed_writers_lose_nothing_acknowledged() {
    let t = tempfile::tempdir().unwrap();
    killed_writers(t.path());
}

/// The same with the drive files in memory (/dev/shm, where there is one: tmpfs refuses
/// O_DIRECT, so the members take buffered I/O through the same io_uring path). A member on
/// tmpfs works, correctly and plainly: no mapping, no file of the engine's beside it.
#[test]
fn killed_writers_on_memory_files_tear_no_sector() {
    let shm = Path::new("/dev/shm");
    let Ok(t) = tempfile::tempdir_in(shm) else {
        return cannot_run("a tmpfs at /dev/shm");
    };
    killed_writers(t.path());
}

fn killed_writers(dir: &Path) {
    use rand::{Rng, SeedableRng};
    let (ds, first) = setup(dir, 6, "64M");
    let size = show(dir, "tank")["size_bytes"].as_u64().unwrap() as usize;
    let mut model = read_back(dir, "tank", 0, size);
    assert!(model[777..777 + first.len()] == first[..]);
    let bin = assert_cmd::cargo::cargo_bin("millrace");
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    for round in 0..10 {
        if round == 3 {
            // The rest runs degraded, through the journal.
            millrace(dir)
                .args(["pool", "fail", "tank"])
                .arg(&ds[2])
                .assert()
                .success();
        }
        let off = rng.random_range(0..size / 2);
        let len = rng.random_range(1 << 20..24 << 20).min(size - off);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        let input = dir.join("in.bin");
        std::fs::write(&input, &data).unwrap();
        let mut child = std::process::Command::new(&bin)
            .env("MILLRACE_HOME", dir.join("home"))
            .current_dir(dir)
            .args([
                "io",
                "write",
                "tank",
                "--offset",
                &off.to_string(),
                "--input",
            ])
            .arg(&input)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
        child.kill().unwrap();
        let finished = child.wait().unwrap().success();
        let now = read_back(dir, "tank", 0, size);
        let mut new = model.clone();
        new[off..off + len].copy_from_slice(&data);
        for s in 0..size / 4096 {
            let r = s * 4096..(s + 1) * 4096;
            assert!(
                now[r.clone()] == model[r.clone()] || now[r.clone()] == new[r.clone()],
                "round {round}: sector {s} holds neither its old nor its new content (writer finished: {finished})"
            );
        }
        if finished {
            assert!(
                now == new,
                "round {round}: a completed write did not read back"
            );
        }
        let rep = scrub(dir, "tank");
        assert_eq!(rep["mismatches"], 0, "round {round}: {rep}");
        model = now;
    }
    nothing_beside_the_members(dir, &ds);
}

/// The folder that holds a pool's member files holds nothing the engine made: the admin's
/// drives are theirs, and no file (a redo log, a lock, a temporary) is created beside them,
/// whatever filesystem they are on and however often the writer was killed.
fn nothing_beside_the_members(dir: &Path, members: &[PathBuf]) {
    let ours = ["home", "in.bin"];
    let mut beside: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !ours.contains(&n.as_str()))
        .filter(|n| {
            !members
                .iter()
                .any(|m| m.file_name().unwrap().to_string_lossy() == *n)
        })
        .collect();
    beside.sort();
    assert!(
        beside.is_empty(),
        "files were created beside the members in {}: {beside:?}",
        dir.display()
    );
}

/// A pool that crashed mid-write and comes back without one of its drives is not assembled
/// silently: the admin is told why, and `--force` is the explicit way through.
#[test]
fn crash_plus_lost_drive_is_refused_unless_forced() {
    let bin = assert_cmd::cargo::cargo_bin("millrace");
    // The kill must land while the write is under way: a fresh pool per try, growing delays.
    // The write takes about 0.2 s with the process's start on this 2-core machine (debug
    // build, drive files on disk), so the ladder starts well inside that and goes on for
    // slower machines.
    for delay in [
        30u64, 60, 90, 120, 150, 200, 300, 400, 700, 1000, 1500, 2500,
    ] {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path();
        let (ds, _) = setup(dir, 5, "64M");
        std::fs::write(dir.join("in.bin"), pattern(100 << 20, 8)).unwrap();
        let rest: Vec<&PathBuf> = ds.iter().filter(|p| **p != ds[2]).collect();
        let mut child = std::process::Command::new(&bin)
            .env("MILLRACE_HOME", dir.join("home"))
            .current_dir(dir)
            .args(["io", "write", "tank", "--offset", "0", "--input", "in.bin"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        child.kill().unwrap();
        let finished = child.wait().unwrap().success();
        std::fs::rename(&ds[2], dir.join("away.img")).unwrap();
        let mut c = millrace(dir);
        c.args(["pool", "import"]).args(&rest);
        let out = c.output().unwrap();
        std::fs::rename(dir.join("away.img"), &ds[2]).unwrap();
        if out.status.success() {
            // Missed the window: the write had finished, or not yet begun.
            continue;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("not shut down cleanly") && err.contains("--force"),
            "{err}"
        );
        assert!(!finished, "a pool closed cleanly was refused: {err}");
        // The drive comes back: the pool assembles, resyncs, and is consistent.
        let mut c = millrace(dir);
        c.args(["pool", "import"]).args(&ds);
        c.assert().success();
        assert_eq!(show(dir, "tank")["state"], "online");
        let rep = scrub(dir, "tank");
        assert_eq!(rep["mismatches"], 0, "{rep}");
        return;
    }
    panic!("no kill landed inside the write");
}

/// A drive starts failing under a plain `io read`: the member is marked faulty, the hot spare
/// takes its place, and the rebuild starts by itself in the background; the pool comes back to
/// full health with the data intact.
#[test]
fn hot_spare_rebuild_starts_by_itself() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let (ds, data) = setup(dir, 5, "32M");
    std::fs::write(dir.join("s0.img"), vec![0u8; 32 << 20]).unwrap();
    millrace(dir)
        .args(["pool", "spare", "add", "tank"])
        .arg(dir.join("s0.img"))
        .assert()
        .success();
    // The drive loses everything past its first MiB: reads there now fail.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ds[3])
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let got = read_back(dir, "tank", 777, data.len());
    assert!(got == data, "read through a failing drive differs");
    let mut state = String::new();
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(200));
        let out = millrace(dir)
            .args(["pool", "show", "tank", "--json"])
            .output()
            .unwrap();
        if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            state = v["state"].as_str().unwrap().to_string();
            if state == "online" {
                assert!(
                    v["members"][3]["path"]
                        .as_str()
                        .unwrap()
                        .ends_with("s0.img"),
                    "{v}"
                );
                break;
            }
        }
    }
    assert_eq!(state, "online", "the background rebuild did not finish");
    assert!(read_back(dir, "tank", 777, data.len()) == data);
    let rep = scrub(dir, "tank");
    assert_eq!(rep["mismatches"], 0, "{rep}");
}
