//! Reading PDUs from a stream piece by piece: the header first, then the data straight into
//! the buffer where it belongs (or skipped).

use super::consts::{digest, CH_LEN, DIGEST_LEN};
use super::error::{PduError, ReadError};
use super::frame::{frame, Ch, Frame, Negotiated, Side};
use super::head::{decode_head, le32, Head};
use super::inbound::Inbound;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Data at least this long that a read buffer does not already hold goes from the socket
/// straight into its destination: through the buffer it was copied twice. Shorter data still
/// comes through the buffer, whose one read takes in the next PDUs' headers with it. (What the
/// buffer took in with the header is copied from it; a reader expecting data bounds that fill,
/// see [`Inbound`].)
const DIRECT_MIN: usize = 16 * 1024;

/// Reads the next PDU header from a stream and checks it (header digest included), leaving the
/// data (and its digest) unread so the caller can place it where it belongs. Returns the
/// header and its frame, and the raw header bytes (for a termination request's data).
pub async fn read_head<R: AsyncRead + Unpin>(
    r: &mut R,
    side: Side,
    neg: &Negotiated,
) -> Result<(Head, Frame, Vec<u8>), ReadError> {
    read_head_into(r, side, neg, Vec::new()).await
}

/// [`read_head`] into `h`, a buffer handed back with the header in it (a target reading PDU
/// after PDU reuses one instead of allocating one per PDU).
pub async fn read_head_into<R: AsyncRead + Unpin>(
    r: &mut R,
    side: Side,
    neg: &Negotiated,
    mut h: Vec<u8>,
) -> Result<(Head, Frame, Vec<u8>), ReadError> {
    let mut chb = [0u8; CH_LEN];
    r.read_exact(&mut chb).await?;
    let ch = Ch::decode(&chb);
    let f = frame(&ch, side, neg)?;
    // Bounded: at most 128 header bytes, a digest and 255 bytes of padding.
    h.clear();
    h.resize(f.head_len(), 0);
    h[..CH_LEN].copy_from_slice(&chb);
    r.read_exact(&mut h[CH_LEN..]).await?;
    if f.hdgst && digest(&h[..f.hlen()]) != le32(&h, f.hlen()) {
        return Err(PduError::HeaderDigest.into());
    }
    h.truncate(f.hlen());
    let head = decode_head(&f, &h)?;
    Ok((head, f, h))
}

/// Reads a PDU's data into `dst` (exactly `f.data_len` bytes) and checks its digest.
/// `Ok(false)`: the data digest did not match.
pub async fn read_data<R: AsyncRead + Unpin>(
    r: &mut R,
    f: &Frame,
    dst: &mut [u8],
) -> Result<bool, std::io::Error> {
    debug_assert_eq!(dst.len(), f.data_len);
    r.read_exact(dst).await?;
    data_digest_ok(r, f, dst).await
}

/// Reads the data digest that follows `data`, if the PDU has one, and checks it.
async fn data_digest_ok<R: AsyncRead + Unpin>(
    r: &mut R,
    f: &Frame,
    data: &[u8],
) -> Result<bool, std::io::Error> {
    if !f.ddgst {
        return Ok(true);
    }
    let mut d = [0u8; DIGEST_LEN];
    r.read_exact(&mut d).await?;
    Ok(digest(data) == u32::from_le_bytes(d))
}

/// [`read_data`] from a buffered stream: what the buffer holds is copied, the rest of long data
/// is read from the stream into `dst` itself.
pub async fn read_data_direct<R: AsyncRead + Unpin>(
    r: &mut Inbound<R>,
    f: &Frame,
    dst: &mut [u8],
) -> Result<bool, std::io::Error> {
    debug_assert_eq!(dst.len(), f.data_len);
    r.read_exact_direct(dst, DIRECT_MIN).await?;
    data_digest_ok(r, f, dst).await
}

/// Reads and drops a PDU's data (for data that has nowhere to go), in bounded pieces.
pub async fn skip_data<R: AsyncRead + Unpin>(r: &mut R, f: &Frame) -> std::io::Result<()> {
    let mut left = f.data_len + if f.ddgst { DIGEST_LEN } else { 0 };
    let mut junk = [0u8; 4096];
    while left > 0 {
        let n = left.min(junk.len());
        r.read_exact(&mut junk[..n]).await?;
        left -= n;
    }
    Ok(())
}
