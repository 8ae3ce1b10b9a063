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
            let mut buf = vec![0u8; PIECE];
            let mut pos = offset;
            loop {
                let n = fill(&mut src, &mut buf)?;
                if n == 0 {
                    break;
                }
                api.write_bytes(&seg(&pool), pos, &buf[..n])
                    .with_context(|| {
                        format!("{} bytes were written, from {offset}", pos - offset)
                    })?;
                pos += n as u64;
                if n < buf.len() {
                    break;
                }
            }
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
            let mut buf = vec![0u8; chunk_bytes(p.array().geometry().full_stripe_bytes())];
            let mut pos = offset;
            loop {
                let n = fill(&mut src, &mut buf)?;
                if n == 0 {
                    break;
                }
                if pos + n as u64 > size {
                    p.close()?;
                    bail!("the input runs past the end of pool '{pool}' ({size} bytes); {} bytes were written, from {offset}", pos - offset);
                }
                p.write_at(pos, &buf[..n])?;
                pos += n as u64;
                if n < buf.len() {
                    break;
                }
            }
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
