//! The soak's NBD client, as small as the soak needs: the fixed-newstyle handshake with
//! NBD_OPT_GO, simple replies, one request at a time, a write abandoned half-way through its
//! payload, and reads whose replies are never read. (The NBD crate's test client lives in its tests, out of an example's reach.)

use std::path::Path;

use millrace_nbd::proto::{
    CLIENT_FIXED_NEWSTYLE, CLIENT_NO_ZEROES, CMD_DISC, CMD_READ, CMD_WRITE, IHAVEOPT, NBDMAGIC,
    OPT_GO, REP_ACK, REP_INFO, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

pub struct Nbd {
    s: UnixStream,
    next: u64,
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> String {
    move |e| format!("NBD {what}: {e}")
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().expect("4 bytes"))
}

impl Nbd {
    /// Connects to `sock` and enters the transmission phase of `export`.
    pub async fn connect(sock: &Path, export: &str) -> Result<Nbd, String> {
        let mut s = UnixStream::connect(sock).await.map_err(io("connect"))?;
        let mut g = [0u8; 18];
        s.read_exact(&mut g).await.map_err(io("greeting"))?;
        if g[..8] != NBDMAGIC.to_be_bytes() || g[8..16] != IHAVEOPT.to_be_bytes() {
            return Err("the NBD socket did not greet as a newstyle NBD server".into());
        }
        let mut b = (CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES)
            .to_be_bytes()
            .to_vec();
        // NBD_OPT_GO: the name, and no information requests.
        b.extend_from_slice(&IHAVEOPT.to_be_bytes());
        b.extend_from_slice(&OPT_GO.to_be_bytes());
        b.extend_from_slice(&(export.len() as u32 + 6).to_be_bytes());
        b.extend_from_slice(&(export.len() as u32).to_be_bytes());
        b.extend_from_slice(export.as_bytes());
        b.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&b).await.map_err(io("GO"))?;
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h).await.map_err(io("GO's reply"))?;
            let mut data = vec![0u8; be32(&h[16..]) as usize];
            s.read_exact(&mut data).await.map_err(io("GO's reply"))?;
            match be32(&h[12..]) {
                REP_ACK => return Ok(Nbd { s, next: 1 }),
                REP_INFO => continue,
                k => {
                    return Err(format!(
                        "the NBD server refused GO ({k:#x}): {}",
                        String::from_utf8_lossy(&data)
                    ))
                }
            }
        }
    }

    /// A request's header, and its handle.
    fn header(&mut self, cmd: u16, offset: u64, len: u32) -> (Vec<u8>, u64) {
        let handle = self.next;
        self.next += 1;
        let mut b = REQUEST_MAGIC.to_be_bytes().to_vec();
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&cmd.to_be_bytes());
        b.extend_from_slice(&handle.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        (b, handle)
    }

    async fn reply(&mut self, handle: u64) -> Result<(), String> {
        let mut r = [0u8; 16];
        self.s.read_exact(&mut r).await.map_err(io("reply"))?;
        let h = u64::from_be_bytes(r[8..16].try_into().expect("8 bytes"));
        if be32(&r) != SIMPLE_REPLY_MAGIC || h != handle {
            return Err(format!(
                "NBD: a reply that is not the simple reply to request {handle}: {r:02x?}"
            ));
        }
        match be32(&r[4..]) {
            0 => Ok(()),
            e => Err(format!(
                "NBD: the server failed request {handle}: error {e}"
            )),
        }
    }

    pub async fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        let (mut b, h) = self.header(CMD_WRITE, offset, data.len() as u32);
        b.extend_from_slice(data);
        self.s.write_all(&b).await.map_err(io("write"))?;
        self.reply(h).await
    }

    pub async fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, String> {
        let (b, h) = self.header(CMD_READ, offset, len);
        self.s.write_all(&b).await.map_err(io("read"))?;
        self.reply(h).await?;
        let mut d = vec![0u8; len as usize];
        self.s.read_exact(&mut d).await.map_err(io("read's data"))?;
        Ok(d)
    }

    /// A write's header and half its payload, then the connection dropped: the server holds
    /// a buffer for a payload that never comes.
    pub async fn half_write(mut self, offset: u64, data: &[u8]) {
        let (mut b, _) = self.header(CMD_WRITE, offset, data.len() as u32);
        b.extend_from_slice(&data[..data.len() / 2]);
        let _ = self.s.write_all(&b).await;
    }

    /// Reads asked for and the connection dropped before any reply is read: the server's
    /// replies meet a socket whose reader has gone (EPIPE), as with a client killed mid-read.
    pub async fn unread_reads(mut self, volume: u64) {
        let len = 64u32 << 10;
        for i in 0..16u64 {
            let (b, _) = self.header(CMD_READ, i * len as u64 % volume, len);
            if self.s.write_all(&b).await.is_err() {
                return;
            }
        }
    }

    pub async fn disconnect(mut self) {
        let (b, _) = self.header(CMD_DISC, 0, 0);
        let _ = self.s.write_all(&b).await;
    }
}
