//! Layout conversions (`io::interop`) against index formulas written out here, the training
//! checkpoint's round trip and refusals (`io::checkpoint`), and the `--init` errors that point to
//! `dmc weights import`.

use dmc_runtime::io::interop::permute;
use dmc_runtime::io::{
    load_checkpoint, load_weights, save_checkpoint, save_weights, state_path, Conversion, IoError,
    TrainState,
};
use proptest::prelude::*;

fn values(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 * 0.25 - 7.0).collect()
}

#[test]
fn conv_oihw_to_hwio_by_index() {
    let (o, i, kh, kw) = (5, 3, 2, 4);
    let torch = values(o * i * kh * kw);
    let (shape, dmc) = Conversion::ConvOihw
        .to_dmc(&[o, i, kh, kw], &torch)
        .unwrap();
    assert_eq!(shape, vec![kh, kw, i, o]);
    for a in 0..o {
        for b in 0..i {
            for y in 0..kh {
                for x in 0..kw {
                    let t = torch[((a * i + b) * kh + y) * kw + x];
                    let d = dmc[((y * kw + x) * i + b) * o + a];
                    assert_eq!(t, d, "o{a} i{b} y{y} x{x}");
                }
            }
        }
    }
    assert_eq!(
        Conversion::ConvOihw.foreign_shape(&shape),
        vec![o, i, kh, kw]
    );
}

#[test]
fn linear_after_flatten_permutes_rows_from_chw_to_hwc() {
    let (h, w, c, out) = (2, 3, 4, 5);
    let n = h * w * c;
    let torch = values(out * n); // [out, c*h*w], columns in PyTorch's flatten order
    let conv = Conversion::LinearFlattenChw { h, w, c };
    let (shape, dmc) = conv.to_dmc(&[out, n], &torch).unwrap();
    assert_eq!(shape, vec![n, out]);
    for y in 0..h {
        for x in 0..w {
            for ch in 0..c {
                let dmc_row = (y * w + x) * c + ch; // dmc flattens [h, w, c]
                let torch_col = (ch * h + y) * w + x; // PyTorch flattens [c, h, w]
                for o in 0..out {
                    assert_eq!(dmc[dmc_row * out + o], torch[o * n + torch_col]);
                }
            }
        }
    }
    // A plain transpose would put other values there (the permutation is not the identity).
    let (_, plain) = Conversion::LinearTranspose
        .to_dmc(&[out, n], &torch)
        .unwrap();
    assert_ne!(plain, dmc);
}

#[test]
fn shapes_that_do_not_fit_are_refused() {
    assert!(Conversion::ConvOihw.to_dmc(&[2, 3], &values(6)).is_err());
    assert!(Conversion::LinearFlattenChw { h: 2, w: 2, c: 2 }
        .to_dmc(&[3, 7], &values(21))
        .is_err());
    assert!(Conversion::LinearTranspose
        .to_dmc(&[2, 3], &values(5))
        .is_err());
}

proptest! {
    #[test]
    fn every_conversion_inverts(kh in 1usize..4, kw in 1usize..4, i in 1usize..5, o in 1usize..5,
                                h in 1usize..4, w in 1usize..4) {
        let cases = [
            (Conversion::ConvOihw, vec![kh, kw, i, o]),
            (Conversion::LinearTranspose, vec![i, o]),
            (Conversion::LinearFlattenChw { h, w, c: i }, vec![h * w * i, o]),
            (Conversion::Same, vec![o]),
        ];
        for (conv, dmc_shape) in cases {
            let n: usize = dmc_shape.iter().product();
            let data = values(n);
            let (fs, foreign) = conv.from_dmc(&dmc_shape, &data).unwrap();
            prop_assert_eq!(&fs, &conv.foreign_shape(&dmc_shape));
            let (back_shape, back) = conv.to_dmc(&fs, &foreign).unwrap();
            prop_assert_eq!(back_shape, dmc_shape);
            prop_assert_eq!(back, data);
        }
    }

    #[test]
    fn permute_matches_numpy_transpose(d0 in 1usize..4, d1 in 1usize..4, d2 in 1usize..4) {
        let data = values(d0 * d1 * d2);
        // axes (2, 0, 1): out[c][a][b] = in[a][b][c]
        let out = permute(&[d0, d1, d2], &[2, 0, 1], &data);
        for a in 0..d0 {
            for b in 0..d1 {
                for c in 0..d2 {
                    prop_assert_eq!(out[(c * d0 + a) * d1 + b], data[(a * d1 + b) * d2 + c]);
                }
            }
        }
    }
}

fn identity() -> TrainState {
    TrainState {
        steps: 17,
        seed: 3,
        batch: 8,
        samples: 96,
        optimizer: "Adam { lr: 0.001 }".into(),
        best_val_loss: Some(0.123_456_789_012_345_67),
        shuffle: false,
    }
}

#[test]
fn checkpoint_round_trips_exactly_and_deterministically() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("w.state.safetensors");
    let (w, m) = (values(6), vec![1e-30f32, -0.0, 3.5]);
    let params = [("fc.weight".to_string(), vec![2, 3], &w[..])];
    let opt = [("fc.weight.m".to_string(), vec![3], &m[..])];
    save_checkpoint(&p, &params, &opt, &identity()).unwrap();
    let first = std::fs::read(&p).unwrap();
    save_checkpoint(&p, &params, &opt, &identity()).unwrap();
    assert!(
        std::fs::read(&p).unwrap() == first,
        "the same state must give the same bytes"
    );
    let ck = load_checkpoint(
        &p,
        &[("fc.weight".into(), vec![2, 3])],
        &[("fc.weight.m".into(), vec![3])],
    )
    .unwrap();
    assert_eq!(ck.state, identity());
    assert_eq!(ck.params, vec![("fc.weight".to_string(), w.clone())]);
    let bits: Vec<u32> = ck.opt_state[0].1.iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits, m.iter().map(|v| v.to_bits()).collect::<Vec<_>>());

    // Another program or optimizer: refused, naming the tensor.
    let e = load_checkpoint(
        &p,
        &[("fc.weight".into(), vec![3, 2])],
        &[("fc.weight.m".into(), vec![3])],
    )
    .err()
    .unwrap();
    assert!(
        matches!(e, IoError::BadCheckpoint { .. }) && e.to_string().contains("param/fc.weight"),
        "{e}"
    );
    let e = load_checkpoint(&p, &[("fc.weight".into(), vec![2, 3])], &[])
        .err()
        .unwrap();
    assert!(e.to_string().contains("opt/fc.weight.m"), "{e}");
    // A weights file is not a checkpoint.
    let wp = dir.path().join("w.safetensors");
    save_weights(&wp, &params).unwrap();
    let e = load_checkpoint(&wp, &[("fc.weight".into(), vec![2, 3])], &[])
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("not a dmc training checkpoint"),
        "{e}"
    );
    // Non-finite state is never written over a good checkpoint.
    let bad = [f32::NAN, 0.0, 0.0];
    let e = save_checkpoint(
        &p,
        &params,
        &[("fc.weight.m".into(), vec![3], &bad[..])],
        &identity(),
    );
    assert!(matches!(e, Err(IoError::NonFiniteWeights { .. })));
    assert!(std::fs::read(&p).unwrap() == first);
}

#[test]
fn state_path_sits_beside_the_weights() {
    use std::path::Path;
    assert_eq!(
        state_path(Path::new("out/w.safetensors")),
        Path::new("out/w.state.safetensors")
    );
    assert_eq!(
        state_path(Path::new("weights")),
        Path::new("weights.state.safetensors")
    );
}

#[test]
fn init_errors_point_to_the_importer() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    let w = values(12);
    // PyTorch names: no name in common, so no "did you mean".
    save_weights(&p, &[("0.weight".into(), vec![4, 3], &w[..])]).unwrap();
    let e = load_weights(&p, &[("fc.weight".into(), vec![3, 4])]).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, IoError::ForeignNames { .. }), "{e:?}");
    assert!(
        msg.contains("dmc weights import") && !msg.contains("did you mean"),
        "{msg}"
    );
    // dmc's names, PyTorch's layout: transposed.
    save_weights(&p, &[("fc.weight".into(), vec![4, 3], &w[..])]).unwrap();
    let msg = load_weights(&p, &[("fc.weight".into(), vec![3, 4])])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("transposed") && msg.contains("dmc weights import"),
        "{msg}"
    );
    // Another shape altogether: another program.
    let msg = load_weights(&p, &[("fc.weight".into(), vec![2, 6])])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("different program") && !msg.contains("import"),
        "{msg}"
    );
}
