//! CUDA code generation of every op: one small kernel of each (the zoo) renders, its parameters
//! follow its signature, and the sources are pinned by a snapshot; split-K kernels fit their
//! workspace, and the option switches them off.

use dmc_codegen::zoo::zoo;
use dmc_codegen::{kernel_params, render_kernel, CodegenOptions};
use dmc_plan::op::{Role, UnaryKind};
use dmc_plan::plan::Mode;

const PRELUDE_END: &str = "#define DMC_FRAC_1_SQRT_2PI 0.3989422804014327\n";

#[test]
fn the_zoo_covers_every_kernel_op_and_renders() {
    let kinds: std::collections::BTreeSet<&str> = zoo().iter().map(|k| k.op.kind_name()).collect();
    // every Op variant but the 4 leaves and Reshape (four update kinds, SGD, Adam, RMSprop and
    // Lion, and clip_norm's squared-norm link and norm store; four unary kinds per activation; fused epilogues keep their GEMM's kind, the folded
    // global average pool backward has two, the folded average pool backward one; the softmax
    // and its backward; five losses with their gradients; the global max pool and its backward;
    // the transposed convolution; batchnorm's forward, inference form, statistics update and
    // backward out of place and in place; layernorm's forward and backward; the sequence family:
    // embedding, its backward, positions, attention causal or not with their backwards, transpose)
    assert_eq!(kinds.len(), 67 + 4 * UnaryKind::ALL.len(), "{kinds:?}");
    let mut s = String::new();
    for k in zoo() {
        let c = render_kernel(&k, Mode::Train, &CodegenOptions::default())
            .unwrap()
            .expect("has a kernel");
        assert_eq!(c.params, kernel_params(&k.signature));
        s.push_str(&format!(
            "// ===== {} ({}) grid {:?} block {:?}\n",
            c.name, c.template, c.grid, c.block
        ));
        for l in &c.after {
            s.push_str(&format!(
                "// ===== then {} grid {:?} block {:?}\n",
                l.entry, l.grid, l.block
            ));
        }
        let cut = c.source.find(PRELUDE_END).unwrap() + PRELUDE_END.len();
        s.push_str(&c.source[cut..]);
    }
    insta::assert_snapshot!("cuda_zoo", s);
}

#[test]
fn split_k_kernels_have_a_reduce_launch_and_fit_their_workspace() {
    let mut split = Vec::new();
    for k in zoo() {
        let c = render_kernel(&k, Mode::Train, &CodegenOptions::default())
            .unwrap()
            .expect("kernel");
        let Some(then) = &c.then else { continue };
        let s = c.grid[2] as usize;
        assert!(s > 1, "{}: a reduce launch without a split", c.name);
        assert_eq!(then.entry, format!("{}_reduce", c.entry));
        assert!(c
            .source
            .contains(&format!("void __launch_bounds__(256) {}(", then.entry)));
        // the partial sums (s x gm x gn) fit the workspace they are written to
        let ws = k
            .signature
            .params
            .iter()
            .zip(&k.arg_shapes)
            .filter(|(p, _)| p.role == Role::Workspace)
            .map(|(_, s)| s.iter().product::<usize>())
            .max()
            .unwrap();
        let def = |name: &str| -> usize {
            let at = c.source.find(&format!("#define {name} ")).expect(name) + name.len() + 9;
            c.source[at..]
                .split("LL")
                .next()
                .unwrap()
                .trim()
                .parse()
                .expect(name)
        };
        let (gm, gn) = (def("GM"), def("GN"));
        assert!(ws >= s * gm * gn, "{}: {s} x {gm} x {gn} > {ws}", c.name);
        assert_eq!(then.grid[0] as usize, (gm * gn).div_ceil(256), "{}", c.name);
        split.push((k.op.kind_name(), s));
    }
    let kinds: std::collections::BTreeSet<_> = split.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [
            "conv2d",
            "conv2d_bwd_data",
            "conv2d_bwd_weight",
            "conv2d_bwd_weight_update"
        ],
        "{split:?}"
    );
    // the planned room: none for a big grid or a short reduction; enough splits for 256 blocks
    // of 16 x 64 outputs or one per 2048 of a long reduction, at most 128 and 8 MiB
    use dmc_plan::op::split::{split_max, split_partials_elems};
    assert_eq!(split_max(4096, 4096, 1 << 20), 1);
    assert_eq!(split_partials_elems(16, 16, 100), 0);
    assert_eq!(split_max(16, 1024, 9216), 16, "16 tiles: 16 splits");
    assert_eq!(split_partials_elems(16, 1024, 9216), 16 * 16 * 1024);
    assert_eq!(split_max(576, 64, 131072), 56, "8 MiB");
    assert_eq!(split_max(27, 64, 131072), 128);
    assert_eq!(split_max(256, 1000, 1 << 20), 8, "8 MiB of partial sums");
}

#[test]
fn the_attention_backward_launches_its_three_passes_in_order() {
    let mut seen = 0;
    for k in zoo() {
        let c = render_kernel(&k, Mode::Train, &CodegenOptions::default())
            .unwrap()
            .expect("kernel");
        let is_bwd = matches!(k.op.kind_name(), "attention_bwd" | "attention_causal_bwd");
        assert_eq!(!c.after.is_empty(), is_bwd, "{}", c.name);
        if !is_bwd {
            continue;
        }
        seen += 1;
        // delta (one thread per query row), then dk and dv, then dq: one block per tile of a
        // head of a sample each
        let (b, t) = (k.arg_shapes[0][0], k.arg_shapes[0][1]);
        let heads = k.arg_shapes[2][1];
        assert_eq!(
            c.grid[0] as usize,
            (b * heads * t).div_ceil(256),
            "{}",
            c.name
        );
        let names: Vec<String> = c.launches().into_iter().map(|l| l.entry).collect();
        assert_eq!(
            names,
            [
                c.entry.clone(),
                format!("{}_dkv", c.entry),
                format!("{}_dq", c.entry)
            ]
        );
        for l in &c.after {
            assert_eq!(
                l.grid,
                [(b * heads * t.div_ceil(64)) as u32, 1, 1],
                "{}",
                c.name
            );
            assert!(c.source.contains(&format!("{}(", l.entry)), "{}", l.entry);
        }
        assert!(
            c.source.contains("const float* __restrict__ do_"),
            "{}",
            c.name
        );
    }
    assert_eq!(seen, 4);
}

#[test]
fn split_k_can_be_switched_off() {
    let off = CodegenOptions {
        split_k: false,
        ..CodegenOptions::default()
    };
    let mut split = 0;
    for k in zoo() {
        let on = render_kernel(&k, Mode::Train, &CodegenOptions::default())
            .unwrap()
            .expect("kernel");
        let c = render_kernel(&k, Mode::Train, &off)
            .unwrap()
            .expect("kernel");
        assert!(c.then.is_none(), "{}: split with split-K off", c.name);
        // grid z is the split (never with split-K off) or a grouped convolution's group
        let groups = match &k.op {
            dmc_plan::op::Op::Conv(op) => match op {
                dmc_plan::op::ConvOp::Conv2d { geom, .. }
                | dmc_plan::op::ConvOp::Conv2dBwdData { geom, .. }
                | dmc_plan::op::ConvOp::Conv2dBwdWeight { geom }
                | dmc_plan::op::ConvOp::Conv2dBwdWeightUpdate { geom, .. }
                | dmc_plan::op::ConvOp::ConvTranspose2d { geom, .. } => geom.groups,
            },
            _ => 1,
        };
        assert_eq!(c.grid[2] as usize, groups, "{}", c.name);
        assert!(!c.source.contains("_reduce("), "{}", c.name);
        if on.then.is_some() {
            split += 1;
        }
    }
    // (some with fused work: an epilogue in the reduction entry, a bias gradient)
    assert!(split >= 6, "{split} of the zoo's kernels are split-K");
}
