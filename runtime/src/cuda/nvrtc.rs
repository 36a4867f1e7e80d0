//! NVRTC: finding the library, compiling a kernel to CUBIN (or PTX), reading ptxas' resource
//! usage, and an on-disk cache of compiled modules.
//!
//! The library is opened by absolute path with `libloading` (so a CUDA 12 or 13 `libnvrtc.so.1x`
//! anywhere on disk works, whatever sonames cudarc's own loader would try). Discovery order:
//! 1. `$DMC_NVRTC` (the library file, or a directory holding it);
//! 2. `$CUDA_PATH/lib64`, `$CUDA_HOME/lib64`, `/usr/local/cuda/lib64`,
//!    `/usr/local/cuda/targets/x86_64-linux/lib`;
//! 3. Python wheels: `site-packages/nvidia/cuda_nvrtc/lib` (CUDA 12 wheel) and
//!    `site-packages/nvidia/cu13/lib` (CUDA 13) under `$VIRTUAL_ENV`, `$CONDA_PREFIX`, the user's
//!    and the system's Python directories;
//! 4. the system loader by name (`libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so`).
//!
//! The cache lives in `$DMC_CACHE_DIR` or `~/.cache/dmc`, keyed by SHA-256 of (source, options,
//! arch, NVRTC version); entries are written atomically (`io::files::replace_file`) and carry a SHA-256
//! checksum of their payload: a corrupt entry is recompiled, never trusted.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::error::CudaError;

type NvrtcResult = c_int;
type Program = *mut std::ffi::c_void;

/// The NVRTC entry points dmc uses.
pub struct Nvrtc {
    _lib: libloading::Library,
    pub path: PathBuf,
    pub version: (i32, i32),
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
}

// SAFETY: NVRTC's API is thread-safe for distinct programs; the struct only holds function
// pointers into a library that stays loaded for the struct's lifetime.
unsafe impl Send for Nvrtc {}
// SAFETY: as above.
unsafe impl Sync for Nvrtc {}

/// How to get NVRTC, for error messages.
pub const INSTALL_HINT: &str = "install it with `pip install nvidia-cuda-nvrtc-cu12` and set \
DMC_NVRTC=<site-packages>/nvidia/cuda_nvrtc/lib/libnvrtc.so.12, or install the CUDA toolkit \
(/usr/local/cuda/lib64)";

pub use super::nvrtc_search::candidates;

static NVRTC: OnceLock<Result<Nvrtc, String>> = OnceLock::new();

/// NVRTC, loaded once per process (see the module docs for where it is looked for).
pub fn nvrtc() -> Result<&'static Nvrtc, CudaError> {
    NVRTC
        .get_or_init(load)
        .as_ref()
        .map_err(|e| CudaError::NvrtcMissing(e.clone()))
}

fn load() -> Result<Nvrtc, String> {
    let mut tried = Vec::new();
    for c in candidates() {
        // SAFETY: loading NVRTC runs its initialisers, which have no preconditions.
        match unsafe { libloading::Library::new(&c) } {
            Ok(lib) => return bind(lib, c).map_err(|e| format!("{e}; {INSTALL_HINT}")),
            Err(e) => tried.push(format!("{} ({e})", c.display())),
        }
    }
    Err(format!(
        "NVRTC (libnvrtc.so) was not found; {INSTALL_HINT}. Tried: {}",
        tried.join(", ")
    ))
}

fn bind(lib: libloading::Library, path: PathBuf) -> Result<Nvrtc, String> {
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the symbol has this C signature in every NVRTC since 11.1 (nvrtc.h).
            *unsafe { lib.get($name) }.map_err(|e| {
                format!(
                    "`{}` lacks {}: {e}",
                    path.display(),
                    String::from_utf8_lossy($name)
                )
            })?
        };
    }
    let version_fn: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult =
        sym!(b"nvrtcVersion");
    let (mut maj, mut min) = (0, 0);
    // SAFETY: two valid out-pointers.
    let r = unsafe { version_fn(&mut maj, &mut min) };
    if r != 0 {
        return Err(format!("nvrtcVersion failed ({r})"));
    }
    Ok(Nvrtc {
        create: sym!(b"nvrtcCreateProgram"),
        compile: sym!(b"nvrtcCompileProgram"),
        destroy: sym!(b"nvrtcDestroyProgram"),
        log_size: sym!(b"nvrtcGetProgramLogSize"),
        log: sym!(b"nvrtcGetProgramLog"),
        cubin_size: sym!(b"nvrtcGetCUBINSize"),
        cubin: sym!(b"nvrtcGetCUBIN"),
        ptx_size: sym!(b"nvrtcGetPTXSize"),
        ptx: sym!(b"nvrtcGetPTX"),
        error_string: sym!(b"nvrtcGetErrorString"),
        version: (maj, min),
        path,
        _lib: lib,
    })
}

/// What NVRTC produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Device code for a real architecture (`sm_XX`), with ptxas' resource report.
    Cubin,
    /// PTX for a virtual architecture (`compute_XX`), JIT-compiled by the driver.
    Ptx,
}

/// A compiled kernel module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// CUBIN, or PTX with a trailing NUL.
    pub image: Vec<u8>,
    pub log: String,
    pub from_cache: bool,
}

/// ptxas' resource usage of one entry point (from `--ptxas-options=-v`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    pub registers: u32,
    pub shared_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_bytes: u32,
}

fn num_before(s: &str, suffix: &str) -> Option<u32> {
    let i = s.find(suffix)?;
    s[..i].split_whitespace().last()?.parse().ok()
}

/// Parses the ptxas report in an NVRTC log (`Used N registers, ... M bytes smem`, `N bytes stack
/// frame, N bytes spill stores, N bytes spill loads`). With several entry points (a split-K
/// reduction, the attention backward's passes): the registers and shared memory of the entry with
/// the most shared memory (the tiled one; of those, the most registers), the spills of every
/// function added up and the largest stack frame.
pub fn parse_resources(log: &str) -> Resources {
    let mut r = Resources::default();
    let mut best: Option<(u32, u32)> = None;
    for line in log.lines() {
        if line.contains("Used") && line.contains("registers") {
            let regs = num_before(line, " registers").unwrap_or(0);
            let smem = line
                .split(',')
                .find(|p| p.contains("smem"))
                .and_then(|p| num_before(p, " bytes smem"))
                .unwrap_or(0);
            if !matches!(best, Some((br, bs)) if (bs, br) >= (smem, regs)) {
                best = Some((regs, smem));
            }
        }
        if line.contains("spill stores") {
            for part in line.split(',') {
                if let Some(v) = num_before(part, " bytes stack frame") {
                    r.stack_bytes = r.stack_bytes.max(v);
                }
                if let Some(v) = num_before(part, " bytes spill stores") {
                    r.spill_stores += v;
                }
                if let Some(v) = num_before(part, " bytes spill loads") {
                    r.spill_loads += v;
                }
            }
        }
    }
    if let Some((regs, smem)) = best {
        r.registers = regs;
        r.shared_bytes = smem;
    }
    r
}

/// Lines of an NVRTC log that are warnings (ptxas' `info` lines are not).
pub fn warnings(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.to_ascii_lowercase().contains("warning"))
        .map(str::to_string)
        .collect()
}

/// `sm_90` -> 90; accepts `sm_90`, `sm_90a`, `compute_90`, `90`.
pub fn arch_number(arch: &str) -> Option<u32> {
    let d = arch
        .trim_start_matches("sm_")
        .trim_start_matches("compute_")
        .trim_end_matches(['a', 'f']);
    d.parse().ok().filter(|&v: &u32| (30..=200).contains(&v))
}

/// The NVRTC options for `arch` (e.g. `sm_90`).
pub fn options(arch: &str, out: Output) -> Vec<String> {
    let n = arch_number(arch).unwrap_or(0);
    let arch = match out {
        Output::Cubin => format!("--gpu-architecture=sm_{n}"),
        Output::Ptx => format!("--gpu-architecture=compute_{n}"),
    };
    vec![
        arch,
        "--std=c++17".into(),
        "--ptxas-options=-v".into(),
        "-lineinfo".into(),
    ]
}

impl Nvrtc {
    fn err(&self, call: &str, r: NvrtcResult) -> CudaError {
        // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any code.
        let msg = unsafe { CStr::from_ptr((self.error_string)(r)) }
            .to_string_lossy()
            .into_owned();
        CudaError::Nvrtc(format!("{call}: {msg}"))
    }

    /// Compiles `source` (entry points `extern "C"`) for `arch` without the cache.
    pub fn compile_uncached(
        &self,
        name: &str,
        source: &str,
        arch: &str,
        out: Output,
    ) -> Result<Compiled, CudaError> {
        if arch_number(arch).is_none() {
            return Err(CudaError::Nvrtc(format!(
                "bad GPU architecture `{arch}` (expected e.g. sm_80, sm_90)"
            )));
        }
        let src = CString::new(source).map_err(|_| CudaError::Nvrtc("NUL in source".into()))?;
        let cname = CString::new(format!("{name}.cu"))
            .map_err(|_| CudaError::Nvrtc("NUL in name".into()))?;
        let opts: Vec<CString> = options(arch, out)
            .into_iter()
            .map(|o| CString::new(o).map_err(|_| CudaError::Nvrtc("NUL in option".into())))
            .collect::<Result<_, _>>()?;
        let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated strings, no headers (null arrays with count 0).
        let r = unsafe {
            (self.create)(
                &mut prog,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if r != 0 {
            return Err(self.err("nvrtcCreateProgram", r));
        }
        let result = (|| {
            // SAFETY: `prog` was created above; the option pointers outlive the call.
            let rc = unsafe { (self.compile)(prog, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
            let mut n = 0usize;
            // SAFETY: `prog` is valid; `n` is a valid out-pointer.
            let r = unsafe { (self.log_size)(prog, &mut n) };
            if r != 0 {
                return Err(self.err("nvrtcGetProgramLogSize", r));
            }
            let mut buf = vec![0u8; n.max(1)];
            // SAFETY: `buf` holds the `n` bytes NVRTC reported.
            let r = unsafe { (self.log)(prog, buf.as_mut_ptr() as *mut c_char) };
            if r != 0 {
                return Err(self.err("nvrtcGetProgramLog", r));
            }
            let log = String::from_utf8_lossy(&buf)
                .trim_end_matches('\0')
                .to_string();
            if rc != 0 {
                return Err(CudaError::Compile {
                    kernel: name.into(),
                    log: format!("{}\n{log}", self.err("nvrtcCompileProgram", rc)),
                });
            }
            let (size_fn, get_fn, what) = match out {
                Output::Cubin => (self.cubin_size, self.cubin, "CUBIN"),
                Output::Ptx => (self.ptx_size, self.ptx, "PTX"),
            };
            let mut n = 0usize;
            // SAFETY: `prog` compiled successfully; `n` is a valid out-pointer.
            let r = unsafe { size_fn(prog, &mut n) };
            if r != 0 {
                return Err(self.err(&format!("nvrtcGet{what}Size"), r));
            }
            let mut image = vec![0u8; n];
            // SAFETY: `image` holds the `n` bytes NVRTC reported.
            let r = unsafe { get_fn(prog, image.as_mut_ptr() as *mut c_char) };
            if r != 0 {
                return Err(self.err(&format!("nvrtcGet{what}"), r));
            }
            Ok(Compiled {
                image,
                log,
                from_cache: false,
            })
        })();
        // SAFETY: `prog` was created above and is destroyed exactly once.
        unsafe { (self.destroy)(&mut prog) };
        result
    }

    /// Compiles through the on-disk cache (see the module docs).
    pub fn compile(
        &self,
        name: &str,
        source: &str,
        arch: &str,
        out: Output,
    ) -> Result<Compiled, CudaError> {
        let key = cache_key(source, arch, out, self.version);
        if let Some(path) = cache_path(&key) {
            if let Some(c) = read_entry(&path) {
                return Ok(c);
            }
            let c = self.compile_uncached(name, source, arch, out)?;
            // A cache that cannot be written is not an error: the next run compiles again.
            let _ = write_entry(&path, &c);
            return Ok(c);
        }
        self.compile_uncached(name, source, arch, out)
    }
}

/// The cache directory: `$DMC_CACHE_DIR`, else `~/.cache/dmc`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DMC_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dmc"))
}

fn cache_key(source: &str, arch: &str, out: Output, version: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(b"dmc-nvrtc-1\0");
    h.update(source.as_bytes());
    h.update(b"\0");
    h.update(options(arch, out).join(" ").as_bytes());
    h.update(format!("\0{arch}\0{out:?}\0nvrtc {}.{}", version.0, version.1).as_bytes());
    hex(&h.finalize())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn cache_path(key: &str) -> Option<PathBuf> {
    cache_dir().map(|d| d.join("nvrtc").join(format!("{key}.bin")))
}

const MAGIC: &[u8; 8] = b"DMCNVRT1";

/// `MAGIC | sha256(payload) | payload`, payload = `u64 log_len | log | image`.
fn encode(c: &Compiled) -> Vec<u8> {
    let mut payload = Vec::with_capacity(8 + c.log.len() + c.image.len());
    payload.extend_from_slice(&(c.log.len() as u64).to_le_bytes());
    payload.extend_from_slice(c.log.as_bytes());
    payload.extend_from_slice(&c.image);
    let mut out = Vec::with_capacity(40 + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&Sha256::digest(&payload));
    out.extend_from_slice(&payload);
    out
}

fn decode(bytes: &[u8]) -> Option<Compiled> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    if rest.len() < 40 {
        return None;
    }
    let (sum, payload) = rest.split_at(32);
    if Sha256::digest(payload).as_slice() != sum {
        return None;
    }
    let n = u64::from_le_bytes(payload[..8].try_into().ok()?) as usize;
    let body = &payload[8..];
    if n > body.len() {
        return None;
    }
    let log = String::from_utf8(body[..n].to_vec()).ok()?;
    Some(Compiled {
        image: body[n..].to_vec(),
        log,
        from_cache: true,
    })
}

/// A cache entry, or `None` if missing or corrupt (then it is recompiled and overwritten).
pub fn read_entry(path: &Path) -> Option<Compiled> {
    decode(&std::fs::read(path).ok()?)
}

/// Writes a cache entry atomically (the crate's one atomic writer, without fsync: an entry
/// carries a checksum and a damaged one is recompiled).
pub fn write_entry(path: &Path, c: &Compiled) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let bytes = encode(c);
    crate::io::files::replace_file(path, crate::io::files::Durability::Cache, |w| {
        std::io::Write::write_all(w, &bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_report() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
            ptxas info    : Function properties for k\n\
            \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 40 registers, used 1 barriers, 8448 bytes smem, 400 bytes cmem[0]\n";
        let r = parse_resources(log);
        assert_eq!(
            r,
            Resources {
                registers: 40,
                shared_bytes: 8448,
                spill_stores: 4,
                spill_loads: 12,
                stack_bytes: 8
            }
        );
        assert!(warnings(log).is_empty());
    }

    #[test]
    fn a_multi_entry_report_gives_the_tiled_entry_and_every_spill() {
        let log = "ptxas info    : Compiling entry function 'k_dq' for 'sm_90'\n\
            \x20   0 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
            ptxas info    : Used 96 registers, used 1 barriers, 34560 bytes smem\n\
            ptxas info    : Compiling entry function 'k_dkv' for 'sm_90'\n\
            \x20   16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 119 registers, used 1 barriers, 34560 bytes smem\n\
            ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 19 registers, used 0 barriers\n";
        assert_eq!(
            parse_resources(log),
            Resources {
                registers: 119,
                shared_bytes: 34560,
                spill_stores: 12,
                spill_loads: 16,
                stack_bytes: 16
            }
        );
    }

    #[test]
    fn cache_entries_roundtrip_and_corruption_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nvrtc/x.bin");
        let c = Compiled {
            image: vec![1, 2, 3, 0],
            log: "ok".into(),
            from_cache: false,
        };
        write_entry(&p, &c).unwrap();
        let back = read_entry(&p).unwrap();
        assert_eq!(back.image, c.image);
        assert!(back.from_cache);
        let mut bytes = std::fs::read(&p).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&p, &bytes).unwrap();
        assert!(read_entry(&p).is_none());
        std::fs::write(&p, b"DMCNVRT1short").unwrap();
        assert!(read_entry(&p).is_none());
    }

    #[test]
    fn arch_numbers() {
        assert_eq!(arch_number("sm_90"), Some(90));
        assert_eq!(arch_number("sm_90a"), Some(90));
        assert_eq!(arch_number("compute_80"), Some(80));
        assert_eq!(arch_number("sm_x"), None);
    }
}
