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

/// One launch of an entry point of a kernel's translation unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Launch {
    pub entry: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
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
}

impl CudaKernel {
    /// Every launch of one step, in order.
    pub fn launches(&self) -> Vec<Launch> {
        let mut v = vec![Launch {
            entry: self.entry.clone(),
            grid: self.grid,
            block: self.block,
        }];
        v.extend(self.then.clone());
        v.extend(self.after.iter().cloned());
        v
    }

    /// The launch arguments, one 8-byte value per parameter of [`kernel_params`] in order: the
    /// pointer of signature slot `i` from `ptrs[i]`, then the seed, the step and the bits of the
    /// learning rate as an f64. The CUDA backend and the host emulator both launch with exactly
    /// these values.
    pub fn launch_values(&self, ptrs: &[u64], s: &Scalars) -> Vec<u64> {
        self.params
            .iter()
            .map(|p| match p.source {
                ArgSource::Buffer(i) => ptrs[i],
                ArgSource::Seed => s.seed,
                ArgSource::Step => s.step,
                ArgSource::Lr => f64::from(s.lr).to_bits(),
            })
            .collect()
    }
}
