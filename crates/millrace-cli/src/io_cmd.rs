use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use millrace_service::model::MAX_RAW_IO;

use crate::format::parse_bytes;
use crate::service::Service;

#[derive(Subcommand)]
pub enum IoCmd {
    /// Write standard input (or --input) into a pool at a byte offset.
    Write {
        pool: String,
        #[arg(long, value_parser = parse_bytes)]
        offset: u64,
        /// Read from this file instead of standard input.
        #[arg(long)]
        input: Option<PathBuf>,
    },
    /// Read bytes from a pool to standard output (or --output).
    Read {
        pool: String,
        #[arg(long, value_parser = parse_bytes)]
        offset: u64,
        #[arg(long, value_parser = parse_bytes)]
        length: u64,
        #[arg(long)]
        output: Option<PathBuf>,
    },
}

/// Standard input, or the file given.
fn open_input(input: Option<&Path>) -> Result<Box<dyn Read>> {
    Ok(match input {
        Some(f) => Box::new(
            std::fs::File::open(f).with_context(|| format!("cannot open {}", f.display()))?,
        ),
        None => Box::new(std::io::stdin().lock()),
    })
}

/// Standard output, or the file given (created).
fn open_output(output: Option<&Path>) -> Result<Box<dyn Write>> {
    Ok(match output {
        Some(f) => Box::new(
            std::fs::File::create(f).with_context(|| format!("cannot create {}", f.display()))?,
        ),
        None => Box::new(std::io::stdout().lock()),
    })
}

/// Reads until `buf` is full or the input ends (a pipe hands over short reads); returns the
/// bytes read, 0 at the end.
fn fill(src: &mut dyn Read, buf: &mut [u8]) -> Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        let r = src.read(&mut buf[n..]).context("cannot read the input")?;
        if r == 0 {
            break;
        }
        n += r;
    }
    Ok(n)
}

/// Streams `src` into a pool from `offset` through `write`, in pieces of at most `chunk` bytes
/// whose boundaries after the first fall on multiples of `align` in the pool. So every piece but
/// the edges covers whole stripes (no read-modify-write), and, as `align` is a multiple of the
/// 4 KiB sector, no sector is split between two pieces: a process killed between pieces leaves
/// each sector wholly old or wholly new, as it promises for one write. Returns the end offset.
fn write_stream(
    src: &mut dyn Read,
    offset: u64,
    chunk: usize,
    align: u64,
    mut write: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<u64> {
    debug_assert!(align > 0 && chunk as u64 >= align && align.is_multiple_of(4096));
    let mut buf = vec![0u8; chunk];
    let mut pos = offset;
    loop {
        let want = chunk - (pos % align) as usize;
        let n = fill(src, &mut buf[..want])?;
        if n == 0 {
            break;
        }
        write(pos, &buf[..n])?;
        pos += n as u64;
        if n < want {
            break;
        }
    }
    Ok(pos)
}

impl IoCmd {
    pub fn pool(&self) -> &str {
        match self {
            IoCmd::Write { pool, .. } | IoCmd::Read { pool, .. } => pool,
        }
    }
}

/// Streams in pieces of whole full stripes, so aligned input is written without
/// read-modify-write; a pool whose full stripe is too large for one call (the API takes at most
/// `MAX_RAW_IO`) in 16 MiB pieces. Returns (piece, alignment of the pieces' boundaries).
fn pieces(full_stripe: u64) -> (usize, u64) {
    let chunk = full_stripe * (8u64 << 20).div_ceil(full_stripe).max(1);
    if chunk <= MAX_RAW_IO {
        (chunk as usize, full_stripe)
    } else {
        (16 << 20, 16 << 20)
    }
}

/// A member failed during this command and a hot spare took its place: with no server to run
/// the rebuild, start `millrace pool rebuild` in the background, so it begins by itself. It
/// waits for this process's drives, and logs to MILLRACE_HOME/rebuild-POOL.log.
fn start_pending_rebuild(home: &Path, svc: &dyn Service, name: &str, had_rebuild: bool) {
    let rebuilding = svc.pool(name).is_ok_and(|v| v.info.rebuild.is_some());
    if svc.live() || had_rebuild || !rebuilding {
        return;
    }
    let log = home.join(format!("rebuild-{name}.log"));
    let started = std::fs::File::create(&log).and_then(|f| {
        let err = f.try_clone()?;
        std::process::Command::new(std::env::current_exe()?)
            .arg("--home")
            .arg(home)
            .args(["pool", "rebuild", name])
            .stdin(std::process::Stdio::null())
            .stdout(f)
            .stderr(err)
            .spawn()
    });
    match started {
        Ok(_) => eprintln!("a hot spare replaced a failed member of pool '{name}'; its rebuild runs in the background (log: {})", log.display()),
        Err(e) => eprintln!("a hot spare replaced a failed member of pool '{name}', but the rebuild could not be started ({e}); run `millrace pool rebuild {name}`"),
    }
}

fn write(svc: &dyn Service, pool: &str, offset: u64, input: Option<&Path>) -> Result<()> {
    let info = svc.pool(pool)?.info;
    let size = info.size_bytes;
    if offset > size {
        bail!("offset {offset} lies past the end of pool '{pool}' ({size} bytes)");
    }
    let mut src = open_input(input)?;
    let (chunk, align) = pieces(info.full_stripe_bytes);
    let pos = write_stream(&mut src, offset, chunk, align, |at, data| {
        if at + data.len() as u64 > size {
            bail!("the input runs past the end of pool '{pool}' ({size} bytes); {} bytes were written, from {offset}", at - offset);
        }
        svc.write_data(pool, at, data)
            .with_context(|| format!("{} bytes were written, from {offset}", at - offset))?;
        Ok(())
    })?;
    eprintln!("wrote {} bytes at offset {offset}", pos - offset);
    Ok(())
}

fn read(
    svc: &dyn Service,
    pool: &str,
    offset: u64,
    length: u64,
    output: Option<&Path>,
) -> Result<()> {
    let info = svc.pool(pool)?.info;
    let size = info.size_bytes;
    if offset.checked_add(length).is_none_or(|e| e > size) {
        bail!("the range {offset}+{length} lies past the end of pool '{pool}' ({size} bytes)");
    }
    let mut dst = open_output(output)?;
    let piece = pieces(info.full_stripe_bytes).0 as u64;
    let mut done = 0u64;
    while done < length {
        let n = (length - done).min(piece);
        let b = svc.read_data(pool, offset + done, n)?;
        dst.write_all(&b).context("cannot write the output")?;
        done += n;
    }
    dst.flush()?;
    Ok(())
}

/// `millrace io`, through the service layer: the server's API when one runs, else the pool
/// opened here; the same pieces either way.
pub fn run(home: &Path, svc: &dyn Service, cmd: IoCmd) -> Result<()> {
    let had_rebuild = svc.pool(cmd.pool())?.info.rebuild.is_some();
    let r = match &cmd {
        IoCmd::Write {
            pool,
            offset,
            input,
        } => write(svc, pool, *offset, input.as_deref()),
        IoCmd::Read {
            pool,
            offset,
            length,
            output,
        } => read(svc, pool, *offset, *length, output.as_deref()),
    };
    start_pending_rebuild(home, svc, cmd.pool(), had_rebuild);
    r
}

#[cfg(test)]
mod tests {
    use super::write_stream;
    use proptest::prelude::*;

    /// Hands over at most `step` bytes per read, as a pipe does.
    struct Trickle<'a> {
        data: &'a [u8],
        step: usize,
    }

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.step).min(self.data.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    proptest! {
        /// The pieces put together are the input, at the right place, and every boundary
        /// between two pieces lies on a multiple of `align`: so no 4 KiB sector is split
        /// between two writes that a crash could separate.
        #[test]
        fn pieces_cover_the_input_and_meet_on_aligned_boundaries(
            offset in 0u64..1 << 22,
            len in 0usize..300_000,
            align_sectors in 1u64..8,
            chunk_aligns in 1usize..4,
            step in 1usize..70_000,
        ) {
            let align = align_sectors * 4096;
            let chunk = chunk_aligns * align as usize;
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let mut src = Trickle { data: &data, step };
            let mut pieces: Vec<(u64, Vec<u8>)> = Vec::new();
            let end = write_stream(&mut src, offset, chunk, align, |at, d| {
                pieces.push((at, d.to_vec()));
                Ok(())
            })
            .unwrap();
            prop_assert_eq!(end, offset + len as u64);
            let mut pos = offset;
            let mut joined = Vec::new();
            for (i, (at, d)) in pieces.iter().enumerate() {
                prop_assert_eq!(*at, pos);
                prop_assert!(!d.is_empty() && d.len() <= chunk);
                if i > 0 {
                    prop_assert!(at.is_multiple_of(align), "piece {} starts at {}", i, at);
                }
                joined.extend_from_slice(d);
                pos += d.len() as u64;
            }
            prop_assert_eq!(joined, data);
        }
    }
}
