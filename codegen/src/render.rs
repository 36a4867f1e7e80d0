//! Rendering: a plan kernel's template and context ([`crate::spec`]) through `tera` to its CUDA C
//! source and launch geometry.

use std::fmt::Write as _;

use tera::Tera;

use dmc_plan::plan::{Kernel, Mode, Plan};

use crate::error::CodegenError;
use crate::kernel::{kernel_params, sharded_kernel_params, CudaKernel, Launch, Phase};
use crate::options::CodegenOptions;
use crate::spec::common::{blocks, Spec, ELEM_THREADS};
use crate::templates::TEMPLATES;

fn tera() -> Result<Tera, CodegenError> {
    let mut t = Tera::default();
    t.add_raw_templates(TEMPLATES.iter().copied())
        .map_err(|e| CodegenError::Template {
            template: "(all)".into(),
            kernel: String::new(),
            message: error_chain(&e),
        })?;
    Ok(t)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let _ = write!(s, ": {c}");
        src = c.source();
    }
    s
}

/// The C identifier of a kernel's entry point.
pub fn entry_name(k: &Kernel) -> String {
    let mut s = String::from("dmc_");
    s.extend(
        k.name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
    );
    s
}

/// Renders one kernel (`None` for leaves and `Reshape`, which have no kernel). `mode` is the plan's
/// (dropout is the identity in `Eval`).
pub fn render_kernel(
    k: &Kernel,
    mode: Mode,
    opts: &CodegenOptions,
) -> Result<Option<CudaKernel>, CodegenError> {
    render_with(&tera()?, k, mode, 1, opts)
}

fn render_with(
    t: &Tera,
    k: &Kernel,
    mode: Mode,
    ranks: usize,
    opts: &CodegenOptions,
) -> Result<Option<CudaKernel>, CodegenError> {
    let Some(Spec {
        template,
        mut ctx,
        grid,
        block,
        split,
        outputs,
        gemm,
        passes,
        program,
        ranked,
    }) = crate::spec::spec(k, mode, ranks, opts)?
    else {
        return Ok(None);
    };
    let params = if ranked {
        sharded_kernel_params(&k.op.signature())
    } else {
        kernel_params(&k.op.signature())
    };
    let entry = entry_name(k);
    let decls: Vec<&str> = params.iter().map(|p| p.decl.as_str()).collect();
    ctx.insert("name", &k.name);
    ctx.insert("entry", &entry);
    ctx.insert("params", &decls.join(", "));
    let source = t
        .render(template, &ctx)
        .map_err(|e| CodegenError::Template {
            template: template.into(),
            kernel: k.name.clone(),
            message: error_chain(&e),
        })?;
    let then = if split > 1 {
        Some(Launch {
            entry: format!("{entry}_reduce"),
            grid: [blocks(outputs, ELEM_THREADS, &k.name)?, 1, 1],
            block: [ELEM_THREADS, 1, 1],
            col0: 0,
        })
    } else {
        None
    };
    let after = passes
        .into_iter()
        .map(|p| Launch {
            entry: format!("{entry}_{}", p.suffix),
            grid: p.grid,
            block: p.block,
            col0: 0,
        })
        .collect();
    // a sharded kernel's launches, their entries named by suffix
    let program = program
        .into_iter()
        .map(|p| match p {
            Phase::Launch(l) => Phase::Launch(Launch {
                entry: format!("{entry}_{}", l.entry),
                ..l
            }),
            c => c,
        })
        .collect();
    Ok(Some(CudaKernel {
        id: k.id,
        name: k.name.clone(),
        entry,
        template,
        source,
        grid,
        block,
        params,
        then,
        after,
        gemm,
        program,
    }))
}

/// Renders every kernel of the plan that has one, in plan order (a data-parallel plan's
/// kernels for its [`Plan::ranks`]).
pub fn render_plan(plan: &Plan, opts: &CodegenOptions) -> Result<Vec<CudaKernel>, CodegenError> {
    let t = tera()?;
    let mut out = Vec::new();
    for k in &plan.kernels {
        if let Some(c) = render_with(&t, k, plan.mode, plan.ranks, opts)? {
            out.push(c);
        }
    }
    Ok(out)
}
