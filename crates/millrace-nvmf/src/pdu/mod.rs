//! The NVMe/TCP PDU codec (NVM Express TCP Transport Specification 1.0): the 8-byte common
//! header, the per-type headers, optional CRC32C header and data digests, and padding up to the
//! data offset (PDO). Hand-written because no maintained Rust crate speaks this wire format.
//!
//! Every length is checked against what the two sides negotiated before anything is allocated:
//! a receiver never trusts PLEN further than `Negotiated::max_data`.

// The pieces, each using only those above it:
//   consts:  PDU types, flags, fatal error statuses, header lengths, the digest
//   error:   why a PDU was refused (`PduError`)
//   frame:   the common header and where a PDU's parts lie (`Ch`, `Frame`, `frame`)
//   head:    the per-type headers (`Head`), decoded and encoded
//   codec:   whole PDUs in a byte buffer (`decode`, `encode_head`, `encode`)
//   inbound: a stream's read buffer whose next fill can be bounded (`Inbound`)
//   stream:  PDUs read piece by piece from a stream (`read_head`, `read_data`, `skip_data`)
mod codec;
mod consts;
mod error;
mod frame;
mod head;
mod inbound;
mod stream;

pub use codec::{decode, encode, encode_head, encode_head_into, encode_head_len_into, Pdu};
pub use consts::{
    digest, fes, flags, pdu_type, CH_LEN, CMD_HLEN, DATA_HLEN, DIGEST_LEN, IC_LEN, R2T_HLEN,
    RESP_HLEN, TERM_HLEN, TERM_MAX_DATA,
};
pub use error::{PduError, ReadError};
pub use frame::{frame, Ch, Frame, Negotiated, Side};
pub use head::{decode_head, DataHdr, Head, IcReq, IcResp, R2t};
pub use inbound::Inbound;
pub use stream::{read_data, read_data_direct, read_head, read_head_into, skip_data};

#[cfg(test)]
mod tests;
