//! The receiving side of a stream with a read buffer, like tokio's `BufReader`, whose next fill
//! can be told to take in less than the buffer holds.
//!
//! Why: a target that has sent R2Ts expects H2CData PDUs, each a short header and up to 128 KiB
//! of data that [`Inbound::read_exact_direct`] takes from the socket straight into the
//! command's pool buffer. A full fill for the header takes in the first 64 KiB of that data
//! too, which must then be copied out of the read buffer: 4-5% of the core in 128K writes over
//! NVMe/TCP, 1% when the fill stops at the header (docs/PERFORMANCE.md). `BufReader` has no
//! way to bound one fill, hence this small type by hand.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};

pub struct Inbound<R> {
    inner: R,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
}

impl<R: AsyncRead + Unpin> Inbound<R> {
    pub fn with_capacity(capacity: usize, inner: R) -> Inbound<R> {
        Inbound {
            inner,
            buf: vec![0; capacity.max(1)].into_boxed_slice(),
            pos: 0,
            end: 0,
        }
    }

    /// What the buffer holds, not yet consumed.
    pub fn buffer(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    pub fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }

    /// Reads exactly `dst.len()` bytes: what the buffer holds first; then, while at least
    /// `direct_min` bytes are left, straight from the stream into `dst` (read through the buffer
    /// they would be copied twice); a shorter rest through the buffer, whose one read takes in
    /// what follows with it.
    pub async fn read_exact_direct(&mut self, dst: &mut [u8], direct_min: usize) -> io::Result<()> {
        let held = self.buffer().len().min(dst.len());
        dst[..held].copy_from_slice(&self.buffer()[..held]);
        self.consume(held);
        let mut done = held;
        // The buffer is empty whenever data is left: what the stream gives next is this data.
        while dst.len() - done >= direct_min.max(1) {
            let n = self.inner.read(&mut dst[done..]).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            done += n;
        }
        self.read_exact(&mut dst[done..]).await?;
        Ok(())
    }

    /// What the buffer holds; when empty, first fills it with what one read of the stream gives,
    /// at most `limit` bytes (the buffer's capacity at most). Empty at the end of the stream.
    pub async fn fill_limited(&mut self, limit: usize) -> io::Result<&[u8]> {
        std::future::poll_fn(|cx| self.poll_fill(cx, limit).map_ok(|_| ())).await?;
        Ok(self.buffer())
    }

    fn poll_fill(&mut self, cx: &mut Context<'_>, limit: usize) -> Poll<io::Result<&[u8]>> {
        if self.pos == self.end {
            let cap = limit.clamp(1, self.buf.len());
            let mut rb = ReadBuf::new(&mut self.buf[..cap]);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut rb))?;
            self.end = rb.filled().len();
            self.pos = 0;
        }
        Poll::Ready(Ok(&self.buf[self.pos..self.end]))
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Inbound<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        // A read at least as long as the buffer gains nothing from going through it.
        if me.pos == me.end && out.remaining() >= me.buf.len() {
            return Pin::new(&mut me.inner).poll_read(cx, out);
        }
        let cap = me.buf.len();
        let held = ready!(me.poll_fill(cx, cap))?;
        let n = held.len().min(out.remaining());
        out.put_slice(&held[..n]);
        me.consume(n);
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncWriteExt, DuplexStream};

    /// `len` patterned bytes sent and the stream closed, read through a buffer of `capacity`.
    async fn sent(len: u32, capacity: usize) -> (Vec<u8>, Inbound<DuplexStream>) {
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        tx.write_all(&data).await.unwrap();
        (data, Inbound::with_capacity(capacity, rx))
    }

    #[tokio::test]
    async fn a_limited_fill_leaves_the_rest_in_the_stream() {
        let (data, mut r) = sent(100_000, 64 * 1024).await;
        assert_eq!(r.fill_limited(24).await.unwrap(), &data[..24]);
        r.consume(24);
        // Empty buffer: a long read goes to the stream itself, in order.
        let mut big = vec![0u8; 70_000];
        r.read_exact(&mut big).await.unwrap();
        assert_eq!(big, data[24..70_024]);
        // A short read fills the whole buffer and is served from it.
        let mut small = [0u8; 10];
        r.read_exact(&mut small).await.unwrap();
        assert_eq!(small, data[70_024..70_034]);
        assert_eq!(r.buffer(), &data[70_034..]);
        let rest = r.fill_limited(usize::MAX).await.unwrap().to_vec();
        r.consume(rest.len());
        assert_eq!(rest, data[70_034..]);
        assert!(r.fill_limited(8).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_direct_read_takes_the_buffer_then_the_stream() {
        let (data, mut r) = sent(300_000, 4096).await;
        let mut head = [0u8; 28];
        r.read_exact(&mut head).await.unwrap();
        assert_eq!(head, data[..28]);
        let mut dst = vec![0u8; 200_000];
        r.read_exact_direct(&mut dst, 16 * 1024).await.unwrap();
        assert_eq!(dst, data[28..200_028]);
        let mut rest = vec![0u8; 99_972];
        r.read_exact_direct(&mut rest, 16 * 1024).await.unwrap();
        assert_eq!(rest, data[200_028..]);
        let mut more = [0u8; 1];
        assert!(r.read_exact_direct(&mut more, 16 * 1024).await.is_err());
    }

    #[tokio::test]
    async fn a_fill_with_bytes_held_reads_nothing() {
        let (mut tx, rx) = tokio::io::duplex(4096);
        tx.write_all(b"abcdef").await.unwrap();
        let mut r = Inbound::with_capacity(16, rx);
        assert_eq!(r.fill_limited(3).await.unwrap(), b"abc");
        r.consume(1);
        tx.write_all(b"gh").await.unwrap();
        assert_eq!(r.fill_limited(100).await.unwrap(), b"bc");
        r.consume(2);
        assert_eq!(r.fill_limited(100).await.unwrap(), b"defgh");
    }
}
