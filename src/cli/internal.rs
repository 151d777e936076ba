//! The hidden helpers: `__child` (a test reader) and `__bench`.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};

use super::parse::*;

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum ChildMode {
    /// read() the whole file into a heap buffer; keep the fd open.
    Copy,
    /// mmap MAP_SHARED read-only and touch every page.
    Map,
    /// mmap MAP_PRIVATE read-write and write --bytes of it (copy-on-write).
    PrivateWrite,
    /// Allocate and touch --bytes of anonymous memory (holding FILE open, if given).
    Anon,
    /// Copy the --range byte ranges converted per --dtype (F16/BF16 widened to F32, or a
    /// named conversion) into a heap buffer.
    Widen,
    /// mmap read-only (MAP_SHARED, or MAP_PRIVATE with --private) and read every page
    /// over and over, appending each pass's time to --stats.
    MapLoop,
    /// read() the file into a heap buffer, copy it to CUDA device --gpu (cuMemAlloc +
    /// cuMemcpyHtoD), read it back and check it identical, and leave an attestation of
    /// the proven device copy (see `collect::gpu`) until it exits. --free-host frees the
    /// heap buffer after the upload.
    CudaLoad,
}

#[derive(Debug, Args)]
pub struct ChildArgs {
    #[arg(value_enum)]
    pub mode: ChildMode,
    pub file: Option<PathBuf>,
    /// Heap offset of the copy (copy mode), to land at an unusual alignment.
    #[arg(long, default_value_t = 0)]
    pub offset: usize,
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub bytes: u64,
    /// Only these byte ranges of FILE, `START:LEN` (repeatable); copies are laid out one
    /// after another at 16-byte-aligned positions from --offset.
    #[arg(long = "range", value_name = "START:LEN")]
    pub ranges: Vec<String>,
    /// Fill --bytes of extra anonymous memory with pseudo-random data instead of touching
    /// one byte per page (copy and anon modes).
    #[arg(long)]
    pub random: bool,
    /// Exit this many milliseconds after `ready` instead of waiting for stdin to close
    /// (a loader that runs to completion, for `twofold run`).
    #[arg(long, value_name = "MS")]
    pub exit_after_ms: Option<u64>,
    /// map-loop: map MAP_PRIVATE instead of MAP_SHARED.
    #[arg(long)]
    pub private: bool,
    /// copy/widen: close the file after reading it (as `np.load`, `torch.load` and
    /// llama.cpp `--load-mode none` do), so only the copy is left.
    #[arg(long)]
    pub close: bool,
    /// cuda-load: CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub gpu: i32,
    /// cuda-load: free the host buffer once the device copy is made.
    #[arg(long)]
    pub free_host: bool,
    /// map-loop: file to append `<seconds since start> <pass milliseconds>` lines to.
    #[arg(long, value_name = "FILE")]
    pub stats: Option<PathBuf>,
    /// anon: keep touching every page after `ready` (an active competitor).
    #[arg(long)]
    pub touch_loop: bool,
    /// copy: after `ready`, touch new anonymous memory every 50 ms, 2 MiB apart (memory
    /// that keeps changing, as a serving runtime's), and zero the copy on each line read
    /// from stdin (the copy is gone, the memory stays).
    #[arg(long)]
    pub drift: bool,
    /// After `ready`, read 64 bytes of /proc/self/stat every 100 ms and rewrite the first
    /// byte of every page of the extra memory (`--bytes`) in place: I/O (rchar grows) and memory rewritten where it
    /// is, as an inference server between requests, with no page faulted in.
    #[arg(long)]
    pub io_loop: bool,
    /// Source element type for widen mode: f16 or bf16 (widened to F32), or a conversion
    /// by name (`f32_to_f16`, `f32_to_bf16`, `bf16_to_f16`, `f16_to_bf16`, ...).
    #[arg(long, default_value = "f16")]
    pub dtype: String,
    /// Print `armed` and wait for a line on stdin before doing anything (so a tracer can
    /// measure exactly the work of the mode).
    #[arg(long)]
    pub go: bool,
    /// After `ready`, hold --kv bytes of pseudo-random anonymous memory (a KV cache) and
    /// rewrite --kv-rate percent of it per second with new pseudo-random bytes, until
    /// stdin closes (memory that keeps changing, as a serving runtime's).
    #[arg(long, value_parser = parse_size, default_value = "0")]
    pub kv: u64,
    /// Percent of --kv rewritten per second.
    #[arg(long, default_value_t = 10.0)]
    pub kv_rate: f64,
    /// Before `ready`, fork this many workers that share everything set up so far
    /// copy-on-write (a pre-fork worker pool) and wait for stdin to close.
    #[arg(long, default_value_t = 0)]
    pub fork: u32,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

#[derive(Debug, Subcommand)]
pub enum BenchWhat {
    /// Writes a synthetic safetensors model of about SIZE bytes.
    WriteModel {
        file: PathBuf,
        #[arg(value_parser = parse_size)]
        size: u64,
    },
    /// Reads every present page `dupes` would search in PID, 1 MiB per call, and prints
    /// bytes, seconds and GB/s as JSON.
    Readmem { pid: i32 },
    /// Draws bench/scaling.sh's results (IN, JSON: for each of `processes`, `memory_gib`
    /// and `files`, a list of `{"x", "scan_s", "rss_mib"}`) as one PNG: scan time and
    /// peak RSS against each.
    PlotScaling { input: PathBuf, output: PathBuf },
    /// Attaches an empty uprobe program to every entry point of the CUDA driver library
    /// LIB that the upload tracer attaches, prints `attached N`, and holds them until
    /// stdin closes: the floor the overhead benchmark compares the tracer with.
    UprobeFloor { lib: PathBuf },
}
