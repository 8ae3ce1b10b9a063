//! Waits, up to 10 s, until a target holds no pool buffer and no connection once its hosts have
//! gone: the check every memory test ends with.

use millrace_io::BufPool;
use millrace_nvmf::Target;
use std::time::{Duration, Instant};

pub async fn wait_drained(bufs: &BufPool, t: &Target) {
    let t0 = Instant::now();
    while bufs.usage().in_use_bytes != 0 || t.stats().connections_open != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "buffers or connections left after the hosts went: {:?}, {} open",
            bufs.usage(),
            t.stats().connections_open
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
