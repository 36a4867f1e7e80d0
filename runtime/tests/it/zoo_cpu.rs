//! Every kernel of the CUDA op zoo (one kernel of every op variant, as rendered and NVRTC-compiled in
//! CI and run on the GPU by `dmc gpu-selftest`) is also a valid kernel for the CPU reference: the shapes,
//! chunk sizes and workspaces it declares are accepted and it computes finite outputs. An invalid zoo
//! kernel would otherwise only show up on a GPU machine.

use dmc_codegen::zoo::zoo;
use dmc_plan::op::{DType, Op, PoolOp, Role};
use dmc_plan::plan::Mode;
use dmc_runtime::cpu::executor::run_single_kernel;

#[test]
fn every_zoo_kernel_runs_on_the_cpu_reference() {
    let kernels = zoo();
    assert!(kernels.len() >= 40, "only {} zoo kernels", kernels.len());
    for k in &kernels {
        let sig = k.op.signature();
        // a max-pool's argmax: window cell (pad_top, pad_left), inside the image in every floor window (0, the
        // corner, is padding in a padded pool's first window: a corrupt argmax)
        let argmax = match k.op {
            Op::Pool(PoolOp::MaxPoolBwd { geom }) => (geom.pad_top * geom.kw + geom.pad_left) as u8,
            _ => 0,
        };
        let mut args: Vec<Vec<u8>> = sig
            .params
            .iter()
            .zip(&k.arg_shapes)
            .enumerate()
            .map(|(i, (p, shape))| {
                let n: usize = shape.iter().product();
                match p.dtype {
                    // Values in (0, 1): valid for every input (Adam's second moment must be >= 0).
                    DType::F32 => (0..n)
                        .flat_map(|j| {
                            (0.05 + 0.9 * (((i * 31 + j * 17) % 97) as f32 / 97.0)).to_ne_bytes()
                        })
                        .collect(),
                    DType::I32 => vec![0u8; n * 4],
                    DType::U8 => vec![argmax; n],
                }
            })
            .collect();
        let scalars = dmc_codegen::Scalars {
            seed: 7,
            step: 1,
            lr: dmc_plan::update::UpdateRule::of(&k.op).map_or(0.0, |r| r.lr()),
            rank: 0,
        };
        run_single_kernel(k, Mode::Train, &scalars, &mut args)
            .unwrap_or_else(|e| panic!("zoo kernel `{}` ({}): {e}", k.name, k.op.kind_name()));
        for (a, p) in args.iter().zip(&sig.params) {
            if p.dtype == DType::F32 && matches!(p.role, Role::Out | Role::InOut) {
                let finite = a
                    .chunks_exact(4)
                    .all(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]).is_finite());
                assert!(finite, "zoo kernel `{}`: non-finite `{}`", k.name, p.name);
            }
        }
    }
}
