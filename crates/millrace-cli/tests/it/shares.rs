//! `millrace share` refusals on this machine: without a server, without clients, too small, and
//! on a host that lacks what shares need (each named in a sentence). Real shares need root and
//! the kernel's nbd, xfs and nfsd: tests/guest/nfs-share.sh proves them in a guest kernel.

use std::path::Path;

use crate::common::{millrace, serve};
use predicates::prelude::PredicateBooleanExt;
use predicates::str::contains;

/// What this host surely lacks for shares, as the phrase the refusal must contain; None where
/// it might have everything (then a create would make a real share, which this test avoids).
fn surely_missing() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("root privileges");
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let modules = Path::new("/lib/modules").join(release.trim());
    if !Path::new("/sys/module/nbd").exists() && !modules.exists() {
        return Some("NBD client");
    }
    None
}

#[test]
fn share_refusals_are_sentences() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let mut c = millrace(dir);
    c.args([
        "pool", "create", "tank", "--level", "raid5", "--strip", "64k", "--create", "160M",
    ]);
    for i in 0..4 {
        c.arg(format!("drives/d{i}.img"));
    }
    c.assert().success();

    // No server: shares need it.
    millrace(dir)
        .args([
            "share",
            "create",
            "tank/data",
            "--size",
            "1G",
            "--client",
            "127.0.0.1",
        ])
        .assert()
        .failure()
        .stderr(contains("start `millrace serve` first"));

    let _server = serve(dir);
    millrace(dir)
        .args(["share", "create", "tank/data", "--size", "1G"])
        .assert()
        .failure()
        .stderr(contains("--client"));
    millrace(dir)
        .args([
            "share",
            "create",
            "tank/data",
            "--size",
            "1G",
            "--client",
            "a(b)",
        ])
        .assert()
        .failure()
        .stderr(contains("is not an NFS client"));
    millrace(dir)
        .args([
            "share",
            "create",
            "tank/data",
            "--size",
            "100M",
            "--client",
            "127.0.0.1",
        ])
        .assert()
        .failure()
        .stderr(contains("at least 300 MiB"));
    match surely_missing() {
        Some(what) => {
            millrace(dir)
                .args([
                    "share", "create", "tank/data", "--size", "320M", "--client", "127.0.0.1",
                ])
                .assert()
                .failure()
                .stderr(contains("this host cannot serve NFS shares; it lacks"))
                .stderr(contains(what));
        }
        None => eprintln!(
            "this host may be able to serve shares; the refusal for a missing prerequisite is not checked here (tests/guest/nfs-share.sh makes real shares)"
        ),
    }
    // Nothing was left behind by the refusals.
    millrace(dir)
        .args(["volume", "list", "tank"])
        .assert()
        .success()
        .stdout(contains("data").not());
    millrace(dir)
        .args(["share", "list"])
        .assert()
        .success()
        .stdout(contains("no shares"));
    millrace(dir)
        .args(["share", "delete", "tank/data"])
        .assert()
        .failure()
        .stderr(contains("no volume named data"));
}
