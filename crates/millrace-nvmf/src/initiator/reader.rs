//! A queue's reading half: one task per queue that reads the target's PDUs and hands each
//! command its completion and read data, or sends the data an R2T asks for.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::{AsyncWriteExt, BufReader};

use super::{Completion, Error, Shared};
use crate::cmd::{Cqe, Status};
use crate::pdu::{
    self, read_data, read_head, skip_data, DataHdr, Frame, Head, Negotiated, R2t, Side,
};

type Reader = BufReader<tokio::net::tcp::OwnedReadHalf>;

/// Reads PDUs until the connection fails or the target breaks the protocol; then every
/// command still waiting fails.
pub(super) async fn reader(mut rd: Reader, sh: Arc<Shared>, neg: Negotiated, _align: usize) {
    loop {
        let (head, f, _) = match read_head(&mut rd, Side::Host, &neg).await {
            Ok(x) => x,
            Err(e) => {
                let msg = e.to_string();
                fail_all(&sh, || Error::Protocol(msg.clone()));
                return;
            }
        };
        let next = match head {
            Head::Resp(cqe) => {
                if let Some(w) = sh.waiters.lock().remove(&cqe.cid) {
                    let _ = w.tx.send(Ok(Completion {
                        cqe,
                        data: w.read_buf,
                    }));
                }
                ControlFlow::Continue(())
            }
            Head::C2HData(d) => c2h_data(&mut rd, &sh, &f, d).await,
            Head::R2t(r) => r2t(&sh, r),
            Head::TermReq { fes, fei, .. } => {
                fail_all(&sh, || Error::Terminated { fes, fei });
                ControlFlow::Break(())
            }
            _ => {
                fail_all(&sh, || Error::Protocol("an unexpected PDU type".into()));
                ControlFlow::Break(())
            }
        };
        if next.is_break() {
            return;
        }
    }
}

fn fail_all(sh: &Shared, why: impl Fn() -> Error) {
    sh.closed.store(true, Ordering::Relaxed);
    for (_, w) in sh.waiters.lock().drain() {
        let _ = w.tx.send(Err(why()));
    }
}

/// Read data for a command: placed in its buffer at its offset; the command completes here
/// when the target says the data carries its success.
async fn c2h_data(rd: &mut Reader, sh: &Shared, f: &Frame, d: DataHdr) -> ControlFlow<()> {
    let w = sh.waiters.lock().remove(&d.cccid);
    let Some(mut w) = w else {
        let _ = skip_data(rd, f).await;
        return ControlFlow::Continue(());
    };
    let off = d.datao as usize;
    if off != w.received || off + f.data_len > w.read_buf.len() {
        let _ = w.tx.send(Err(Error::Protocol(format!(
            "C2HData at {off}+{} does not fit the {}-byte read",
            f.data_len,
            w.read_buf.len()
        ))));
        fail_all(sh, || Error::Closed);
        return ControlFlow::Break(());
    }
    match read_data(rd, f, &mut w.read_buf[off..off + f.data_len]).await {
        Ok(true) => {}
        Ok(false) => {
            let _ = w.tx.send(Err(Error::Protocol(
                "a C2HData digest did not match".into(),
            )));
            fail_all(sh, || Error::Closed);
            return ControlFlow::Break(());
        }
        Err(e) => {
            let _ = w.tx.send(Err(Error::Io(e)));
            fail_all(sh, || Error::Closed);
            return ControlFlow::Break(());
        }
    }
    w.received += f.data_len;
    if d.success {
        let cqe = Cqe::new(d.cccid, Status::SUCCESS, 0);
        let _ = w.tx.send(Ok(Completion {
            cqe,
            data: w.read_buf,
        }));
    } else {
        sh.waiters.lock().insert(d.cccid, w);
    }
    ControlFlow::Continue(())
}

/// The target is ready for a range of a write's data: checked against the command, then sent
/// from another task so that this one keeps reading.
fn r2t(sh: &Arc<Shared>, r: R2t) -> ControlFlow<()> {
    let data = sh
        .waiters
        .lock()
        .get(&r.cccid)
        .and_then(|w| w.write_data.clone());
    let Some(data) = data else {
        fail_all(sh, || {
            Error::Protocol("an R2T named a command with no data to send".into())
        });
        return ControlFlow::Break(());
    };
    let (start, len) = (r.r2to as usize, r.r2tl as usize);
    if start.checked_add(len).is_none_or(|e| e > data.len()) || len == 0 {
        fail_all(sh, || {
            Error::Protocol("an R2T asked for data outside the command".into())
        });
        return ControlFlow::Break(());
    }
    tokio::spawn(send_h2c_data(sh.clone(), r, data, start, len));
    ControlFlow::Continue(())
}

/// Sends `data[start..start + len]` as H2CData PDUs of at most MAXH2CDATA bytes; stops
/// quietly if the connection fails (the reader then fails the commands).
async fn send_h2c_data(sh: Arc<Shared>, r: R2t, data: Arc<Vec<u8>>, start: usize, len: usize) {
    let mut w = sh.wr.lock().await;
    let mut off = start;
    while off < start + len {
        let n = (start + len - off).min(sh.maxh2cdata);
        let h = DataHdr {
            cccid: r.cccid,
            ttag: r.ttag,
            datao: off as u32,
            datal: n as u32,
            last: off + n == start + len,
            success: false,
        };
        let chunk = &data[off..off + n];
        let hd = pdu::encode_head(&Head::H2CData(h), chunk, sh.hdgst, sh.ddgst, 1);
        let mut res = w.write_all(&hd).await;
        if res.is_ok() {
            res = w.write_all(chunk).await;
        }
        if res.is_ok() && sh.ddgst {
            res = w.write_all(&pdu::digest(chunk).to_le_bytes()).await;
        }
        if res.is_err() {
            return;
        }
        off += n;
    }
}
