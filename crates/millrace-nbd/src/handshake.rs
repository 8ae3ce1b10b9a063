//! Fixed newstyle negotiation: greeting, client flags, then option haggling until the client
//! picks an export (NBD_OPT_GO or NBD_OPT_EXPORT_NAME) or leaves.

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::{debug, info, warn};

use crate::meta::*;
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
    /// The client selected `base:allocation` for this export: it may ask for block status.
    pub allocation: bool,
}

/// Where one connection's haggling stands.
struct Haggle<'a> {
    inner: &'a Inner,
    peer: &'a Peer,
    /// The one export this listener serves (an export's own socket or port), if any.
    only: Option<&'a str>,
    /// The largest request the server takes (its pool's largest buffer).
    max_payload: u32,
    no_zeroes: bool,
    structured: bool,
    /// The export name of the last NBD_OPT_SET_META_CONTEXT that selected `base:allocation`.
    meta: Option<String>,
}

/// What one option leads to.
enum Next {
    /// Go on haggling.
    More,
    /// The client leaves (or was refused where the protocol can only hang up).
    Leave,
    Transmit(Session),
}

/// Runs the handshake. Ok(None): the client left (NBD_OPT_ABORT, or hung up) or was refused;
/// Err: an I/O error or a protocol violation serious enough to hang up.
pub(crate) async fn negotiate<R, W>(
    inner: &Inner,
    r: &mut R,
    w: &mut W,
    peer: &Peer,
    only: Option<&str>,
    max_payload: u32,
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
    let mut h = Haggle {
        inner,
        peer,
        only,
        max_payload,
        no_zeroes: cflags & CLIENT_NO_ZEROES != 0,
        structured: false,
        meta: None,
    };
    for _ in 0..MAX_OPTIONS {
        let Some((option, data)) = read_option(r, w).await? else {
            return Ok(None);
        };
        let Some(data) = data else { continue };
        debug!(option, len = data.len(), "NBD option from {peer}");
        let next = match option {
            OPT_EXPORT_NAME => h.export_name(w, &data).await?,
            OPT_ABORT => {
                // The client may already have gone; a failed ack is no error.
                let _ = reply(w, option, REP_ACK, &[]).await;
                Next::Leave
            }
            OPT_LIST => h.list(w, &data).await?,
            OPT_STRUCTURED_REPLY => h.structured_reply(w, &data).await?,
            OPT_INFO | OPT_GO => h.info_or_go(w, option, &data).await?,
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                h.meta_context(w, option, &data).await?
            }
            OPT_STARTTLS => {
                let m = b"this server does not offer TLS; reach it over its unix socket or a trusted network";
                reply(w, option, REP_ERR_POLICY, m).await?;
                Next::More
            }
            other => {
                let m = format!("option {other} is not supported by this server");
                reply(w, option, REP_ERR_UNSUP, m.as_bytes()).await?;
                Next::More
            }
        };
        match next {
            Next::More => {}
            Next::Leave => return Ok(None),
            Next::Transmit(s) => return Ok(Some(s)),
        }
    }
    Err(protocol_error(format!(
        "the client sent {MAX_OPTIONS} options without choosing an export"
    )))
}

/// Reads one option. Ok(None): the client hung up; Some((option, None)): its data was too
/// large and was skipped and refused.
async fn read_option<R, W>(r: &mut R, w: &mut W) -> io::Result<Option<(u32, Option<Vec<u8>>)>>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
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
        return Ok(Some((h.option, None)));
    }
    let mut data = vec![0u8; h.len as usize];
    r.read_exact(&mut data).await?;
    Ok(Some((h.option, Some(data))))
}

impl Haggle<'_> {
    fn session(&self, entry: Arc<ExportEntry>, name: &str) -> Session {
        let allocation = self.structured && self.meta.as_deref() == Some(name);
        Session {
            entry,
            structured: self.structured,
            allocation,
        }
    }

    /// NBD_OPT_EXPORT_NAME: this option cannot be answered with an error; refusing means
    /// hanging up.
    async fn export_name<W: AsyncWrite + Unpin>(&self, w: &mut W, data: &[u8]) -> io::Result<Next> {
        let name = parse_name(data).map_err(protocol_error)?;
        let entry = match lookup(self.inner, self.peer, self.only, &name) {
            Lookup::Found(e) => e,
            Lookup::Unknown(m) | Lookup::Forbidden(m) => {
                info!("NBD: closing the connection from {}: {m}", self.peer);
                return Ok(Next::Leave);
            }
        };
        let flags = transmission_flags(&entry, self.structured);
        let size = entry.export.dev.size_bytes();
        w.write_all(&export_name_reply(size, flags, self.no_zeroes))
            .await?;
        w.flush().await?;
        Ok(Next::Transmit(self.session(entry, &name)))
    }

    async fn list<W: AsyncWrite + Unpin>(&self, w: &mut W, data: &[u8]) -> io::Result<Next> {
        if !data.is_empty() {
            let m = b"NBD_OPT_LIST carries no data";
            reply(w, OPT_LIST, REP_ERR_INVALID, m).await?;
            return Ok(Next::More);
        }
        for e in visible(self.inner, self.peer, self.only) {
            reply(w, OPT_LIST, REP_SERVER, &rep_server(&e.export.name)).await?;
        }
        reply(w, OPT_LIST, REP_ACK, &[]).await?;
        Ok(Next::More)
    }

    async fn structured_reply<W: AsyncWrite + Unpin>(
        &mut self,
        w: &mut W,
        data: &[u8],
    ) -> io::Result<Next> {
        if !data.is_empty() {
            let m = b"NBD_OPT_STRUCTURED_REPLY carries no data";
            reply(w, OPT_STRUCTURED_REPLY, REP_ERR_INVALID, m).await?;
            return Ok(Next::More);
        }
        self.structured = true;
        reply(w, OPT_STRUCTURED_REPLY, REP_ACK, &[]).await?;
        Ok(Next::More)
    }

    async fn info_or_go<W: AsyncWrite + Unpin>(
        &self,
        w: &mut W,
        option: u32,
        data: &[u8],
    ) -> io::Result<Next> {
        let req = match parse_info_request(data) {
            Ok(q) => q,
            Err(why) => {
                reply(w, option, REP_ERR_INVALID, why.as_bytes()).await?;
                return Ok(Next::More);
            }
        };
        let Some(entry) = self.found(w, option, &req.name).await? else {
            return Ok(Next::More);
        };
        let ex = &entry.export;
        let flags = transmission_flags(&entry, self.structured);
        let size = ex.dev.size_bytes();
        reply(w, option, REP_INFO, &info_export(size, flags)).await?;
        for kind in &req.requests {
            let payload = match *kind {
                INFO_NAME => info_string(INFO_NAME, &ex.name),
                INFO_DESCRIPTION if !ex.description.is_empty() => {
                    info_string(INFO_DESCRIPTION, &ex.description)
                }
                INFO_BLOCK_SIZE => {
                    let (min, pref, max) = block_sizes(
                        ex.dev.preferred_io_bytes(),
                        ex.dev.block_bytes(),
                        self.max_payload,
                    );
                    info_block_size(min, pref, max)
                }
                // Unknown or unavailable information is simply not sent.
                _ => continue,
            };
            reply(w, option, REP_INFO, &payload).await?;
        }
        reply(w, option, REP_ACK, &[]).await?;
        Ok(if option == OPT_GO {
            Next::Transmit(self.session(entry, &req.name))
        } else {
            Next::More
        })
    }

    /// NBD_OPT_LIST_META_CONTEXT and NBD_OPT_SET_META_CONTEXT: `base:allocation` is the one
    /// context there is. SET replaces what an earlier SET chose.
    async fn meta_context<W: AsyncWrite + Unpin>(
        &mut self,
        w: &mut W,
        option: u32,
        data: &[u8],
    ) -> io::Result<Next> {
        let set = option == OPT_SET_META_CONTEXT;
        if set {
            self.meta = None;
        }
        if !self.structured {
            let m =
                b"metadata contexts need structured replies: send NBD_OPT_STRUCTURED_REPLY first";
            reply(w, option, REP_ERR_INVALID, m).await?;
            return Ok(Next::More);
        }
        let req = match parse_meta_request(data) {
            Ok(q) => q,
            Err(why) => {
                reply(w, option, REP_ERR_INVALID, why.as_bytes()).await?;
                return Ok(Next::More);
            }
        };
        if self.found(w, option, &req.export).await?.is_none() {
            return Ok(Next::More);
        }
        if selects_allocation(&req.queries, !set) {
            let ctx = rep_meta_context(ALLOCATION_ID, BASE_ALLOCATION);
            reply(w, option, REP_META_CONTEXT, &ctx).await?;
            if set {
                self.meta = Some(req.export);
            }
        }
        reply(w, option, REP_ACK, &[]).await?;
        Ok(Next::More)
    }

    /// Looks an export up for an option that can answer with an error; None: refused.
    async fn found<W: AsyncWrite + Unpin>(
        &self,
        w: &mut W,
        option: u32,
        name: &str,
    ) -> io::Result<Option<Arc<ExportEntry>>> {
        let (kind, msg) = match lookup(self.inner, self.peer, self.only, name) {
            Lookup::Found(e) => return Ok(Some(e)),
            Lookup::Unknown(m) => (REP_ERR_UNKNOWN, m),
            Lookup::Forbidden(m) => (REP_ERR_POLICY, m),
        };
        reply(w, option, kind, msg.as_bytes()).await?;
        Ok(None)
    }
}

/// The exports this client may see on this listener.
fn visible(inner: &Inner, peer: &Peer, only: Option<&str>) -> Vec<Arc<ExportEntry>> {
    let mut v = inner.visible(peer);
    if let Some(name) = only {
        v.retain(|e| e.export.name == name);
    }
    v
}

enum Lookup {
    Found(Arc<ExportEntry>),
    Unknown(String),
    Forbidden(String),
}

/// Finds the export a client named. The empty name is the protocol's "default export": ours is
/// the only export this client may see on this listener, if there is exactly one.
fn lookup(inner: &Inner, peer: &Peer, only: Option<&str>, name: &str) -> Lookup {
    if name.is_empty() {
        let mut v = visible(inner, peer, only);
        return match v.len() {
            1 => Lookup::Found(v.pop().unwrap()),
            0 => Lookup::Unknown(
                "there is no default export: this client may use no export here".into(),
            ),
            _ => {
                let names: Vec<&str> = v.iter().map(|e| e.export.name.as_str()).collect();
                Lookup::Unknown(format!(
                    "there is no default export; name one of the exports this client may use: {}",
                    names.join(", ")
                ))
            }
        };
    }
    if only.is_some_and(|o| o != name) {
        return Lookup::Unknown(format!(
            "this socket serves only export {:?}; there is no export named {name:?} here",
            only.unwrap_or_default()
        ));
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
    if !e.export.read_only {
        f |= TF_SEND_FAST_ZERO;
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
