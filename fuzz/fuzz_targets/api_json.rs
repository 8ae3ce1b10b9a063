//! The HTTP API's JSON bodies and query strings: arbitrary bytes read as each request type a
//! handler takes (the first byte picks the type), as the handlers' extractors read them. A
//! body that is accepted must serialise and read back (what the server took can be logged and
//! replayed), the strings the server then parses itself (RAID levels, simulated pools, bench
//! suites) must be refused with a sentence, never a panic, and a bench request goes through
//! what the server does with it before it starts a job (simulated drives made, bounds and the
//! memory budget checked).

#![no_main]

use libfuzzer_sys::fuzz_target;
use millrace_service::model::*;
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

/// What `State::start_bench` does with a request before it starts a job (the simulated
/// pool's path; a served pool needs a server): the suite, the simulated drives (their pacing
/// becomes Durations), the level and geometry, the options' bounds and the memory budget.
fn bench(r: BenchRequest) {
    let Ok(workloads) = millrace_bench::suite(r.suite.as_deref().unwrap_or("all")) else {
        return;
    };
    if let Some(l) = &r.level {
        level(l);
    }
    let Some(spec) = r.sim.as_deref() else {
        return;
    };
    let Ok(setup) = millrace_service::bench::sim_bench_setup(spec, &r) else {
        return;
    };
    let opts = millrace_service::bench::bench_options(&r, workloads);
    if opts.check().is_ok() {
        let _ = opts.memory_bytes(&setup);
        let _ = opts.points();
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
