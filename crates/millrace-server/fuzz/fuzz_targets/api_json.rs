//! The HTTP API's JSON bodies and query strings: arbitrary bytes read as each request type a
//! handler takes (the first byte picks the type), as the handlers' extractors read them. A
//! body that is accepted must serialise and read back (what the server took can be logged and
//! replayed), and the strings the server then parses itself (RAID levels, simulated pools,
//! bench suites) must be refused with a sentence, never a panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use millrace_server::model::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn body<T: DeserializeOwned + Serialize>(data: &[u8]) -> Option<T> {
    let v: T = serde_json::from_slice(data).ok()?;
    let again = serde_json::to_vec(&v).expect("an accepted request serialises");
    let _: T = serde_json::from_slice(&again).expect("and reads back");
    Some(v)
}

fn level(s: &str) {
    let _ = s.parse::<millrace_array::Level>();
}

fn bench(r: BenchRequest) {
    if let Some(s) = &r.sim {
        let _ = s.parse::<millrace_bench::sim::SimSpec>();
    }
    if let Some(s) = &r.suite {
        let _ = millrace_bench::suite(s);
    }
    if let Some(l) = &r.level {
        level(l);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    match pick % 13 {
        0 => {
            if let Some(r) = body::<CreatePool>(rest) {
                level(&r.level);
            }
        }
        1 => drop(body::<CreateVolume>(rest)),
        2 => drop(body::<GrowVolume>(rest)),
        3 => drop(body::<ImportRequest>(rest)),
        4 => drop(body::<NbdExportRequest>(rest)),
        5 => drop(body::<NvmeExportRequest>(rest)),
        6 => drop(body::<PathRequest>(rest)),
        7 => drop(body::<RebuildRequest>(rest)),
        8 => drop(body::<ReplaceRequest>(rest)),
        9 => drop(body::<ScrubRequest>(rest)),
        10 => drop(body::<ShareRequest>(rest)),
        11 => {
            if let Some(r) = body::<BenchRequest>(rest) {
                bench(r);
            }
        }
        _ => {
            // A query string, as axum's Query reads it.
            if let Ok(q) = std::str::from_utf8(rest) {
                let _ = serde_urlencoded::from_str::<DataQuery>(q);
            }
        }
    }
});
