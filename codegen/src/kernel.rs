//! A rendered kernel and its launch: the parameter list every generated kernel takes
//! ([`kernel_params`], derived from the op's one `Signature`), and what the backends launch
//! ([`CudaKernel`], [`Launch`]).

use serde::Serialize;

use dmc_plan::op::{DType, Role, Signature};

use crate::spec::gemm::GemmGeom;

/// Where a kernel parameter's value comes from at launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ArgSource {
    /// The step's buffer for signature slot `i` (`arena base + offset`).
    Buffer(usize),
    /// The run's seed (dropout).
    Seed,
    /// The 1-based step counter (dropout, Adam's t).
    Step,
    /// The step's learning rate (the optimizer updates; see `dmc_plan::schedule`), passed as a
    /// `double` holding the f32 value exactly, so every launch value is 8 bytes.
    Lr,
    /// This process' rank in a data-parallel job (0 alone): a sharded kernel's rows are the
    /// rank's ([`dmc_plan::shard::rows`]).
    Rank,
    /// The first column of the chunk a sharded kernel's launch works on ([`Launch::col0`]).
    Col0,
}

/// The scalars of one launch besides the buffers: what [`ArgSource::Seed`], [`ArgSource::Step`]
/// and [`ArgSource::Lr`] take their values from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scalars {
    pub seed: u64,
    /// The 1-based training step.
    pub step: u64,
    /// The learning rate of this step.
    pub lr: f32,
    /// This process' rank in a data-parallel job (0 alone; [`ArgSource::Rank`]).
    pub rank: u64,
}

/// One parameter of a generated kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelParam {
    pub name: String,
    /// The C type, e.g. `const float*` or `const u64`.
    pub ty: String,
    /// The C declaration, e.g. `const float* __restrict__ x`.
    pub decl: String,
    pub source: ArgSource,
}

/// C and C++ keywords a signature slot may be named after (attention's `do`): [`c_ident`] renames
/// them.
const RESERVED: &[&str] = &[
    "auto", "bool", "break", "case", "char", "class", "const", "continue", "default", "delete",
    "do", "double", "else", "enum", "extern", "float", "for", "goto", "if", "int", "long", "new",
    "operator", "register", "return", "short", "signed", "sizeof", "static", "struct", "switch",
    "template", "this", "typedef", "union", "unsigned", "void", "volatile", "while",
];

/// The C identifier of a signature slot named `name`: the name itself, or with a trailing `_` when
/// it is a C or C++ keyword (attention's `do` is `do_` in the generated source).
pub fn c_ident(name: &str) -> String {
    if RESERVED.contains(&name) {
        format!("{name}_")
    } else {
        name.to_string()
    }
}

/// The parameters of the kernel for `sig`, in order: one pointer per signature slot (in signature
/// order; `const` for `In`; named per [`c_ident`]), then `u64 seed, u64 step, double lr`. The single
/// source of both the generated parameter list and the backend's launch arguments.
pub fn kernel_params(sig: &Signature) -> Vec<KernelParam> {
    let mut v: Vec<KernelParam> = sig
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ty = match p.dtype {
                DType::F32 => "float",
                DType::I32 => "int",
                DType::U8 => "unsigned char",
            };
            let cst = if p.role == Role::In { "const " } else { "" };
            let name = c_ident(&p.name);
            KernelParam {
                ty: format!("{cst}{ty}*"),
                decl: format!("{cst}{ty}* __restrict__ {name}"),
                name,
                source: ArgSource::Buffer(i),
            }
        })
        .collect();
    for (name, source) in [("seed", ArgSource::Seed), ("step", ArgSource::Step)] {
        v.push(KernelParam {
            name: name.into(),
            ty: "const u64".into(),
            decl: format!("const u64 {name}"),
            source,
        });
    }
    v.push(KernelParam {
        name: "lr".into(),
        ty: "const double".into(),
        decl: "const double lr".into(),
        source: ArgSource::Lr,
    });
    v
}

/// The parameters of a sharded (data-parallel) kernel of `sig`: [`kernel_params`], then
/// `u64 rank, u64 col0` ([`ArgSource::Rank`], [`ArgSource::Col0`]).
pub fn sharded_kernel_params(sig: &Signature) -> Vec<KernelParam> {
    let mut v = kernel_params(sig);
    for (name, source) in [("rank", ArgSource::Rank), ("col0", ArgSource::Col0)] {
        v.push(KernelParam {
            name: name.into(),
            ty: "const u64".into(),
            decl: format!("const u64 {name}"),
            source,
        });
    }
    v
}

/// One launch of an entry point of a kernel's translation unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Launch {
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// The value of [`ArgSource::Col0`] for this launch (a sharded kernel's chunk; 0 otherwise).
    pub col0: u64,
}

/// A part of a kernel argument: signature slot `slot` from element (f32) `at` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Region {
    pub slot: usize,
    pub at: usize,
}

impl Region {
    /// Slot `slot` from its start.
    pub fn of(slot: usize) -> Region {
        Region { slot, at: 0 }
    }
}

/// A collective operation between the launches of a data-parallel kernel, on `f32` kernel
/// arguments, among the kernel's `world` ranks; every rank runs the same ones in the same order.
/// Rank `r`'s rows of `n` are [`dmc_plan::shard::rows`]`(n, world, r)`. The emulator runs them
/// with the host collectives (`dmc_runtime::comm`), the CUDA backend with NCCL; `tmp` is scratch
/// for the former (NCCL needs none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Collective {
    /// `buf` is a row-major `[rows, cols]` matrix: this rank's rows become the sum of every
    /// rank's same rows (the other rows are left undefined). `tmp`: `max_rows * cols` elements.
    ReduceScatterRows {
        buf: Region,
        rows: usize,
        cols: usize,
        tmp: Region,
    },
    /// This rank's elements of the `n` at `src` summed over the ranks into `dst` (`src` is only
    /// read). `tmp`: `max_rows(n)` elements.
    ReduceInto {
        src: Region,
        n: usize,
        dst: Region,
        tmp: Region,
    },
    /// `buf` is a row-major `[rows, cols]` matrix of which each rank holds its own rows: every
    /// rank's rows gathered on every rank.
    AllGatherRows {
        buf: Region,
        rows: usize,
        cols: usize,
    },
    /// The `n` elements at `buf` summed over the ranks, the same sum on every rank. `tmp`:
    /// `max_rows(n)` elements.
    AllReduce { buf: Region, n: usize, tmp: Region },
    /// The `n` f64 at `buf` (8-byte aligned: the arena's slots are) summed over the ranks, the
    /// same sum on every rank (batchnorm's per-channel sums).
    AllReduceF64 { buf: Region, n: usize },
}

/// One part of a data-parallel kernel's step: a launch, or a collective.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Phase {
    Launch(Launch),
    Collective(Collective),
}

/// A rendered kernel: its source and launch geometry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CudaKernel {
    /// The plan kernel's id and name.
    pub id: usize,
    pub name: String,
    /// The `extern "C"` entry point.
    pub entry: String,
    /// The template it was rendered from.
    pub template: &'static str,
    pub source: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Launch parameters (see [`kernel_params`]).
    pub params: Vec<KernelParam>,
    /// A second entry of the same translation unit, launched right after `entry` with the same
    /// arguments: the fixed-order reduction of a split-K GEMM's partial sums (see
    /// [`split_k`](crate::split_k)).
    pub then: Option<Launch>,
    /// Further entries of the same translation unit, launched in order after `entry` (and `then`)
    /// with the same arguments, each with its own geometry: the later passes of a multi-pass
    /// kernel (the attention backward's key and query passes, after its `delta` pass).
    pub after: Vec<Launch>,
    /// The GEMM it computes, for a GEMM-shaped kernel (see [`GemmGeom`]).
    pub gemm: Option<GemmGeom>,
    /// A sharded (data-parallel) kernel's step: its launches with the collectives between them,
    /// in order (`entry`, `then` and `after` are then not launched). Empty for every other kernel.
    pub program: Vec<Phase>,
}

impl CudaKernel {
    /// Every launch of one step, in order.
    pub fn launches(&self) -> Vec<Launch> {
        if !self.program.is_empty() {
            return self
                .program
                .iter()
                .filter_map(|p| match p {
                    Phase::Launch(l) => Some(l.clone()),
                    Phase::Collective(_) => None,
                })
                .collect();
        }
        let mut v = vec![Launch {
            entry: self.entry.clone(),
            grid: self.grid,
            block: self.block,
            col0: 0,
        }];
        v.extend(self.then.clone());
        v.extend(self.after.iter().cloned());
        v
    }

    /// One step of the kernel: its [`program`](Self::program), or its launches.
    pub fn phases(&self) -> Vec<Phase> {
        if self.program.is_empty() {
            self.launches().into_iter().map(Phase::Launch).collect()
        } else {
            self.program.clone()
        }
    }

    /// The distinct entry points its launches use, in order of first use (what a backend loads).
    pub fn entries(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for l in self.launches() {
            if !v.contains(&l.entry) {
                v.push(l.entry);
            }
        }
        v
    }

    /// The launch arguments, one 8-byte value per parameter of [`kernel_params`] in order: the
    /// pointer of signature slot `i` from `ptrs[i]`, then the seed, the step and the bits of the
    /// learning rate as an f64. The CUDA backend and the host emulator both launch with exactly
    /// these values. `col0` is the launch's [`Launch::col0`].
    pub fn launch_values(&self, ptrs: &[u64], s: &Scalars, col0: u64) -> Vec<u64> {
        self.params
            .iter()
            .map(|p| match p.source {
                ArgSource::Buffer(i) => ptrs[i],
                ArgSource::Seed => s.seed,
                ArgSource::Step => s.step,
                ArgSource::Lr => f64::from(s.lr).to_bits(),
                ArgSource::Rank => s.rank,
                ArgSource::Col0 => col0,
            })
            .collect()
    }
}
