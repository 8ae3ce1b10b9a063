//! Fixed newstyle negotiation: greeting, client flags, then option haggling until the client
//! picks an export (NBD_OPT_GO or NBD_OPT_EXPORT_NAME) or leaves.

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, info, warn};

use crate::proto::*;
use crate::{Counters, ExportEntry, Inner, Peer};

/// Option data larger than this is skipped (and refused) rather than buffered: the largest
/// legitimate option, NBD_OPT_GO with a 4096-byte name and a few info requests, is far smaller.
const MAX_OPTION_DATA: u32 = 16 << 10;
/// Option data larger than this is not even skipped: the client is hostile; hang up.
const MAX_SKIPPED_OPTION: u32 = 1 << 20;
/// A client haggling longer than this is wasting a connection slot.
const MAX_OPTIONS: usize = 1024;

/// What negotiation ends with when the client goes on to transmission.
pub(crate) struct Session {
    pub entry: Arc<ExportEntry>,
    pub structured: bool,
}

/// Runs the handshake. Ok(None): the client left (NBD_OPT_ABORT, or hung up) or was refused;
/// Err: an I/O error or a protocol violation serious enough to hang up.
pub(crate) async fn negotiate<R, W>(
    inner: &Inner,
    r: &mut R,
    w: &mut W,
    peer: &Peer,
) -> io::Result<Option<Session>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    w.write_all(&greeting()).await?;
    w.flush().await?;
    let cflags = r.read_u32().await?;
    if cflags & !(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES) != 0 {
        // The protocol requires hanging up on client flags we did not offer.
        return Err(protocol_error(format!(
            "the client sent unknown handshake flags {cflags:#x}"
        )));
    }
    let no_zeroes = cflags & CLIENT_NO_ZEROES != 0;
    let mut structured = false;

    for _ in 0..MAX_OPTIONS {
        let mut hb = [0u8; 16];
        match r.read_exact(&mut hb).await {
            Ok(_) => {}
            // Hanging up during haggling is how some clients (nbd-client -l) say goodbye.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        }
        let h = parse_option_header(&hb);
        if h.magic != IHAVEOPT {
            return Err(protocol_error(format!(
                "an option starts with {:#018x}, not the IHAVEOPT magic",
                h.magic
            )));
        }
        if h.len > MAX_OPTION_DATA {
            if h.len > MAX_SKIPPED_OPTION {
                return Err(protocol_error(format!(
                    "option {} carries {} bytes of data",
                    h.option, h.len
                )));
            }
            tokio::io::copy(&mut (&mut *r).take(h.len as u64), &mut tokio::io::sink()).await?;
            let msg = format!(
                "option {} carries {} bytes; this server accepts at most {MAX_OPTION_DATA}",
                h.option, h.len
            );
            reply(w, h.option, REP_ERR_INVALID, msg.as_bytes()).await?;
            continue;
        }
        let mut data = vec![0u8; h.len as usize];
        r.read_exact(&mut data).await?;
        debug!(option = h.option, len = h.len, "NBD option from {peer}");

        match h.option {
            OPT_EXPORT_NAME => {
                // This option cannot be answered with an error: refusing means hanging up.
                let name = match parse_name(&data) {
                    Ok(n) => n,
                    Err(why) => return Err(protocol_error(why)),
                };
                let Some(entry) = find(inner, peer, &name) else {
                    return Ok(None);
                };
                let flags = transmission_flags(&entry, structured);
                let size = entry.export.dev.size_bytes();
                w.write_all(&export_name_reply(size, flags, no_zeroes))
                    .await?;
                w.flush().await?;
                return Ok(Some(Session { entry, structured }));
            }
            OPT_ABORT => {
                // The client may already have gone; a failed ack is no error.
                let _ = reply(w, h.option, REP_ACK, &[]).await;
                return Ok(None);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    reply(
                        w,
                        h.option,
                        REP_ERR_INVALID,
                        b"NBD_OPT_LIST carries no data",
                    )
                    .await?;
                    continue;
                }
                for e in inner.visible(peer) {
                    reply(w, h.option, REP_SERVER, &rep_server(&e.export.name)).await?;
                }
                reply(w, h.option, REP_ACK, &[]).await?;
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    let m = b"NBD_OPT_STRUCTURED_REPLY carries no data";
                    reply(w, h.option, REP_ERR_INVALID, m).await?;
                    continue;
                }
                structured = true;
                reply(w, h.option, REP_ACK, &[]).await?;
            }
            OPT_INFO | OPT_GO => {
                let req = match parse_info_request(&data) {
                    Ok(q) => q,
                    Err(why) => {
                        reply(w, h.option, REP_ERR_INVALID, why.as_bytes()).await?;
                        continue;
                    }
                };
                let entry = match lookup(inner, peer, &req.name) {
                    Lookup::Found(e) => e,
                    Lookup::Unknown(msg) => {
                        reply(w, h.option, REP_ERR_UNKNOWN, msg.as_bytes()).await?;
                        continue;
                    }
                    Lookup::Forbidden(msg) => {
                        reply(w, h.option, REP_ERR_POLICY, msg.as_bytes()).await?;
                        continue;
                    }
                };
                let ex = &entry.export;
                let flags = transmission_flags(&entry, structured);
                let size = ex.dev.size_bytes();
                reply(w, h.option, REP_INFO, &info_export(size, flags)).await?;
                for kind in &req.requests {
                    match *kind {
                        INFO_NAME => {
                            reply(w, h.option, REP_INFO, &info_string(INFO_NAME, &ex.name)).await?
                        }
                        INFO_DESCRIPTION if !ex.description.is_empty() => {
                            let d = info_string(INFO_DESCRIPTION, &ex.description);
                            reply(w, h.option, REP_INFO, &d).await?
                        }
                        INFO_BLOCK_SIZE => {
                            let (min, pref, max) =
                                block_sizes(ex.dev.preferred_io_bytes(), ex.dev.block_bytes());
                            let b = info_block_size(min, pref, max);
                            reply(w, h.option, REP_INFO, &b).await?
                        }
                        // Unknown or unavailable information is simply not sent.
                        _ => {}
                    }
                }
                reply(w, h.option, REP_ACK, &[]).await?;
                if h.option == OPT_GO {
                    return Ok(Some(Session { entry, structured }));
                }
            }
            OPT_STARTTLS => {
                let m = b"this server does not offer TLS; reach it over its unix socket or a trusted network";
                reply(w, h.option, REP_ERR_POLICY, m).await?;
            }
            other => {
                let m = format!("option {other} is not supported by this server");
                reply(w, h.option, REP_ERR_UNSUP, m.as_bytes()).await?;
            }
        }
    }
    Err(protocol_error(format!(
        "the client sent {MAX_OPTIONS} options without choosing an export"
    )))
}

enum Lookup {
    Found(Arc<ExportEntry>),
    Unknown(String),
    Forbidden(String),
}

/// Finds the export a client named. The empty name is the protocol's "default export": ours is
/// the only export this client may see, if there is exactly one.
fn lookup(inner: &Inner, peer: &Peer, name: &str) -> Lookup {
    if name.is_empty() {
        let mut v = inner.visible(peer);
        return if v.len() == 1 {
            Lookup::Found(v.pop().unwrap())
        } else {
            Lookup::Unknown(format!(
                "there is no default export; name one of the {} exports (NBD_OPT_LIST lists them)",
                v.len()
            ))
        };
    }
    let entry = inner.exports.read().unwrap().get(name).cloned();
    match entry {
        None => Lookup::Unknown(format!("there is no export named {name:?}")),
        Some(e) if peer.may_use(&e.export) => Lookup::Found(e),
        Some(_) => {
            Counters::add(&inner.counters.connections_refused, 1);
            warn!("NBD: refused export {name:?} to {peer}: the address is not in its allowed list");
            Lookup::Forbidden(format!("this client's address may not use export {name:?}"))
        }
    }
}

/// `lookup` for NBD_OPT_EXPORT_NAME, which can only refuse by hanging up (with a log line).
fn find(inner: &Inner, peer: &Peer, name: &str) -> Option<Arc<ExportEntry>> {
    match lookup(inner, peer, name) {
        Lookup::Found(e) => Some(e),
        Lookup::Unknown(m) | Lookup::Forbidden(m) => {
            info!("NBD: closing the connection from {peer}: {m}");
            None
        }
    }
}

/// The transmission flags for an export. Multi-conn is honest: FLUSH and FUA flush the whole
/// device, so they cover writes completed on any connection.
fn transmission_flags(e: &ExportEntry, structured: bool) -> u16 {
    let mut f = TF_HAS_FLAGS | TF_SEND_FLUSH | TF_SEND_FUA | TF_CAN_MULTI_CONN | TF_SEND_CACHE;
    if e.export.read_only {
        f |= TF_READ_ONLY;
    } else {
        f |= TF_SEND_TRIM | TF_SEND_WRITE_ZEROES;
    }
    // We always answer a read with one data chunk, so "don't fragment" costs nothing.
    if structured {
        f |= TF_SEND_DF;
    }
    f
}

async fn reply<W: AsyncWrite + Unpin>(
    w: &mut W,
    option: u32,
    kind: u32,
    data: &[u8],
) -> io::Result<()> {
    w.write_all(&option_reply(option, kind, data)).await?;
    w.flush().await
}

fn protocol_error(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}
