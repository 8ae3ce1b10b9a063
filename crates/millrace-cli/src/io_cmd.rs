use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use millrace_array::Cache;

use crate::client::{seg, Api};
use crate::format::parse_bytes;

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

/// Streams in chunks of whole full stripes, so aligned input is written without read-modify-write.
fn chunk_bytes(full_stripe: u64) -> usize {
    (full_stripe * (8u64 << 20).div_ceil(full_stripe).max(1)) as usize
}

/// A member failed during this command and a hot spare took its place: with no server to run
/// the rebuild, start `millrace pool rebuild` in the background, so it begins by itself. It
/// waits for this process's drives, and logs to MILLRACE_HOME/rebuild-POOL.log.
fn start_pending_rebuild(home: &Path, pool: &millrace_array::Pool, had_rebuild: bool) {
    if had_rebuild || pool.info().rebuild.is_none() {
        return;
    }
    let name = pool.name();
    let log = home.join(format!("rebuild-{name}.log"));
    let started = std::fs::File::create(&log).and_then(|f| {
        let err = f.try_clone()?;
        std::process::Command::new(std::env::current_exe()?)
            .arg("--home")
            .arg(home)
            .args(["pool", "rebuild", &name])
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

/// `millrace io` through a running server: the same streaming, in pieces the API takes.
fn run_api(api: &Api, cmd: IoCmd) -> Result<()> {
    const PIECE: usize = 16 << 20;
    match cmd {
        IoCmd::Write {
            pool,
            offset,
            input,
        } => {
            let mut src = open_input(input.as_deref())?;
            let pos = write_stream(&mut src, offset, PIECE, PIECE as u64, |at, data| {
                api.write_bytes(&seg(&pool), at, data)
                    .with_context(|| format!("{} bytes were written, from {offset}", at - offset))
            })?;
            eprintln!("wrote {} bytes at offset {offset}", pos - offset);
            Ok(())
        }
        IoCmd::Read {
            pool,
            offset,
            length,
            output,
        } => {
            let mut dst = open_output(output.as_deref())?;
            let mut done = 0u64;
            while done < length {
                let n = (length - done).min(PIECE as u64);
                let b = api.read_bytes(&seg(&pool), offset + done, n)?;
                dst.write_all(&b).context("cannot write the output")?;
                done += n;
            }
            dst.flush()?;
            Ok(())
        }
    }
}

pub fn run(home: &Path, api: Option<&Api>, cmd: IoCmd) -> Result<()> {
    if let Some(a) = api {
        return run_api(a, cmd);
    }
    match cmd {
        IoCmd::Write {
            pool,
            offset,
            input,
        } => {
            let p = Cache::load(home)?.open(&pool)?;
            let had_rebuild = p.info().rebuild.is_some();
            let size = p.array().size_bytes();
            if offset > size {
                bail!("offset {offset} lies past the end of pool '{pool}' ({size} bytes)");
            }
            let mut src = open_input(input.as_deref())?;
            let fs = p.array().geometry().full_stripe_bytes();
            let pos = write_stream(&mut src, offset, chunk_bytes(fs), fs, |at, data| {
                if at + data.len() as u64 > size {
                    p.close()?;
                    bail!("the input runs past the end of pool '{pool}' ({size} bytes); {} bytes were written, from {offset}", at - offset);
                }
                Ok(p.write_at(at, data)?)
            })?;
            p.close()?;
            eprintln!("wrote {} bytes at offset {offset}", pos - offset);
            start_pending_rebuild(home, &p, had_rebuild);
            Ok(())
        }
        IoCmd::Read {
            pool,
            offset,
            length,
            output,
        } => {
            let p = Cache::load(home)?.open(&pool)?;
            let had_rebuild = p.info().rebuild.is_some();
            let size = p.array().size_bytes();
            if offset.checked_add(length).is_none_or(|e| e > size) {
                bail!(
                    "the range {offset}+{length} lies past the end of pool '{pool}' ({size} bytes)"
                );
            }
            let mut dst = open_output(output.as_deref())?;
            let mut buf = vec![0u8; chunk_bytes(p.array().geometry().full_stripe_bytes())];
            let mut done = 0u64;
            while done < length {
                let n = (length - done).min(buf.len() as u64) as usize;
                p.read_at(offset + done, &mut buf[..n])?;
                dst.write_all(&buf[..n])
                    .context("cannot write the output")?;
                done += n as u64;
            }
            dst.flush()?;
            p.close()?;
            start_pending_rebuild(home, &p, had_rebuild);
            Ok(())
        }
    }
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
