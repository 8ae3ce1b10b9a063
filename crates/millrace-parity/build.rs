//! The AVX-512 and GFNI kernels need intrinsics stabilised in Rust 1.89; the workspace supports
//! older compilers, which build without those kernels.

use std::process::Command;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(millrace_avx512)");
    println!("cargo:rerun-if-changed=build.rs");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let minor = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            // "rustc 1.89.0 (...)"
            let ver = v.split_whitespace().nth(1)?.to_owned();
            let mut parts = ver.split('.');
            (parts.next()? == "1").then_some(())?;
            parts.next()?.parse::<u32>().ok()
        });
    if minor.is_some_and(|m| m >= 89) {
        println!("cargo:rustc-cfg=millrace_avx512");
    }
}
