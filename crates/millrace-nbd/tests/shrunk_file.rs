//! Reads lent from a drive file's mapping in memory (as the array lends them) after the file was
//! truncated behind the server's back. A small reply is batched by copying its bytes: that copy
//! meets the missing pages, whose fault leaves zeroes in it, and the server must not send those
//! zeroes as the drive's data. A large reply is sent from the pages themselves: the kernel's copy
//! fails with EFAULT, which ends the connection, and the server must stop lending from that
//! mapping so that the next read does not end its connection again.

mod common;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use millrace_block::{check_range, BlockDevice, Lent};
use millrace_io::cannot_run;
use millrace_io::mapped::Mapping;
use millrace_io::IoBuf;
use millrace_nbd::proto::*;
use millrace_nbd::NbdServer;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

const SIZE: u64 = 1 << 20;

/// A drive file in /dev/shm, read by pread and lent from its mapping.
struct ShmDev {
    file: File,
    map: Arc<Mapping>,
}

impl ShmDev {
    fn new() -> Option<Arc<ShmDev>> {
        let Ok(file) = tempfile::tempfile_in("/dev/shm") else {
            cannot_run("a tmpfs at /dev/shm");
            return None;
        };
        file.write_all_at(&pattern(3, SIZE as usize), 0).unwrap();
        let map =
            millrace_io::mapped::map(file.as_raw_fd(), SIZE, None).expect("a tmpfs file maps");
        Some(Arc::new(ShmDev {
            file,
            map: Arc::new(map),
        }))
    }
}

impl BlockDevice for ShmDev {
    fn size_bytes(&self) -> u64 {
        SIZE
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        check_range(SIZE, offset, buf.len() as u64)?;
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        check_range(SIZE, offset, data.len() as u64)?;
        self.file.write_all_at(data, offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn lend(&self, offset: u64, len: usize) -> Option<Lent> {
        let p = self.map.lend(offset, len)?;
        // SAFETY: the mapping lives as long as the buffer, which keeps it.
        Some(Lent::from_buf([unsafe {
            IoBuf::lent(p, len, Box::new(self.map.clone()))
        }]))
    }
}

/// A server of `dev` and a client of it (simple replies, so a read's data is not framed).
async fn client(dev: &Arc<ShmDev>) -> (NbdServer, Client<TcpStream>) {
    let server = NbdServer::new();
    server
        .add_export(export("vol", dev.clone(), &["127.0.0.1/32"]))
        .unwrap();
    let s = TcpStream::connect(tcp_server(&server).await).await.unwrap();
    let c = Client::go(s, "vol", false).await.unwrap();
    (server, c)
}

/// One read's reply: Some((error, data)), None where the connection ended instead.
async fn read(c: &mut Client<TcpStream>, offset: u64, len: u32) -> Option<(u32, Vec<u8>)> {
    let h = c.send(CMD_READ, 0, offset, len, &[]).await.ok()?;
    let lens = HashMap::from([(h, len)]);
    let r = tokio::time::timeout(Duration::from_secs(10), c.recv(&lens))
        .await
        .expect("a reply or the end of the connection within 10 s")
        .ok()?;
    assert_eq!(r.handle, h);
    Some((r.error, r.data))
}

fn truncate(dev: &ShmDev) {
    dev.file.set_len(64 << 10).unwrap();
}

#[tokio::test]
async fn a_small_read_copied_from_a_truncated_file_is_read_again_not_sent_as_zeroes() {
    let Some(dev) = ShmDev::new() else { return };
    let (_server, mut c) = client(&dev).await;
    let want = pattern(3, SIZE as usize);
    let (e, got) = read(&mut c, 256 << 10, 4096).await.expect("a reply");
    assert_eq!(e, 0);
    assert!(
        got == want[256 << 10..(256 << 10) + 4096],
        "lent before the fault"
    );
    truncate(&dev);
    for at in [512u64 << 10, 768 << 10] {
        let (e, got) = read(&mut c, at, 4096)
            .await
            .expect("a reply, not a closed connection");
        assert!(
            e != 0,
            "a read past the file's new end reports an error, it sent {} bytes of {}",
            got.len(),
            if got.iter().all(|&b| b == 0) {
                "zeroes"
            } else {
                "data"
            }
        );
    }
    let (e, got) = read(&mut c, 4096, 4096).await.expect("a reply");
    assert_eq!(e, 0, "what the file still holds reads back");
    assert!(got == want[4096..8192]);
}

#[tokio::test]
async fn a_large_read_the_kernel_cannot_send_stops_the_lending() {
    let Some(dev) = ShmDev::new() else { return };
    let (_server, mut c) = client(&dev).await;
    truncate(&dev);
    // Sent from the pages themselves: EFAULT, and the connection ends.
    assert!(read(&mut c, 256 << 10, 64 << 10).await.is_none());
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), c.s.read_to_end(&mut rest)).await;
    assert!(
        dev.map.lend(0, 4096).is_none(),
        "the mapping is out of use, even where the file still has its pages"
    );
    // A new connection's read of the same range is read by pread, which reports the error.
    let (_again, mut c) = client(&dev).await;
    let r = read(&mut c, 256 << 10, 64 << 10).await;
    assert!(
        matches!(r, Some((e, _)) if e != 0),
        "the read is refused with an error, not by ending the connection again"
    );
}
