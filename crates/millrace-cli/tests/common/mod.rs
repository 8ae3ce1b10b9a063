//! Helpers the CLI tests share: running `millrace` in a test folder, test data, JSON reads.
#![allow(dead_code)]

use std::path::Path;

use assert_cmd::Command;
use serde_json::Value;

/// `millrace` with its home and working folder in `dir`.
pub fn millrace(dir: &Path) -> Command {
    let mut c = Command::cargo_bin("millrace").unwrap();
    c.env("MILLRACE_HOME", dir.join("home")).current_dir(dir);
    c
}

/// Deterministic bytes, different for each seed.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Runs a command that must succeed and prints JSON; returns the JSON.
pub fn json(mut c: Command) -> Value {
    let out = c.assert().success().get_output().stdout.clone();
    serde_json::from_slice(&out).unwrap()
}

/// `pool scrub NAME --json`.
pub fn scrub(dir: &Path, name: &str) -> Value {
    let mut c = millrace(dir);
    c.args(["pool", "scrub", name, "--json"]);
    json(c)
}
