//! `dmc weights import|export` of the sequence layers: `embedding`, `pos_embedding`, `attention`
//! (with and without bias) and a `dense` tied to the embedding, on a small GPT-like program.
//! Round trips must give back dmc's weights bit for bit; hand-built PyTorch- and Keras-layout
//! files (values and layouts written here, independently of dmc: `in_proj_weight` rows are
//! `qkv_weight` columns, Keras's query/key/value kernels `[d, heads, dh]` are its column thirds)
//! must import to exactly the tensors their layouts say. (With real PyTorch: the export loads
//! into `nn.MultiheadAttention` strictly and gives `dmc predict`'s outputs; see docs/INTEROP.md.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::dmc;
use crate::interop::{ok, s, tensors, trained, write_safetensors};

type Tensors = BTreeMap<String, (String, Vec<u64>, Vec<u8>)>;

/// tokens -> embedding -> pos_embedding -> two pre-norm attention blocks (the second non-causal,
/// without bias) -> an MLP over the sequence -> layernorm -> the tied head, `vocab` tokens of
/// width 16, `t` positions.
fn gpt(vocab: usize, t: usize, head_bias: bool) -> String {
    format!(
        "input tokens: int[{t}]\ntarget next: int[{t}]\n\
         e = tokens |> embedding({vocab}, 16) as wte\n\
         x = e |> pos_embedding as wpe\n\
         h1 = x + (x |> layernorm as ln1 |> attention(4) as att1)\n\
         h2 = h1 + (h1 |> layernorm as ln2 |> attention(2, causal: false, bias: false) as att2)\n\
         h3 = h2 + (h2 |> dense(24, activation: gelu) as fc1 |> dense(16) as fc2)\n\
         logits = h3 |> layernorm as lnf |> dense({vocab}, tie: e, bias: {head_bias}) as head\n\
         loss cross_entropy(logits, next)\n\
         train {{ batch: 4, optimizer: adam(lr: 1e-2), seed: 1 }}\n"
    )
}

fn write_program(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn export(program: &str, w: &Path, fw: &str, out: &Path, like: Option<&Path>) -> String {
    let mut args = vec![
        "weights",
        "export",
        program,
        "--init",
        s(w),
        "--to",
        fw,
        "-o",
        s(out),
    ];
    if let Some(l) = like {
        args.extend(["--like", s(l)]);
    }
    ok(&args)
}

fn import(program: &str, file: &Path, fw: &str, out: &Path) -> String {
    ok(&[
        "weights",
        "import",
        program,
        s(file),
        "--from",
        fw,
        "-o",
        s(out),
    ])
}

/// A failing import: its stderr.
fn import_err(program: &str, file: &Path, fw: &str, out: &Path) -> String {
    let (code, o, err) = dmc(&[
        "weights",
        "import",
        program,
        s(file),
        "--from",
        fw,
        "-o",
        s(out),
    ]);
    assert_ne!(code, 0, "import of {} succeeded:\n{o}", s(file));
    assert!(!out.exists(), "nothing written on an error");
    err
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn put(t: &mut Tensors, name: &str, shape: &[u64], v: &[f32]) {
    assert_eq!(shape.iter().product::<u64>() as usize, v.len(), "{name}");
    let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    t.insert(name.to_string(), ("F32".into(), shape.to_vec(), bytes));
}

/// Distinct values for tensor number `k`: no two tensors, and no two elements of one, alike.
fn values(k: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((k * 1000 + i) as f32 * 0.618_034).sin() * 0.5)
        .collect()
}

/// `[rows, cols]` -> `[cols, rows]`.
fn transpose(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = v[r * cols + c];
        }
    }
    out
}

/// The values of tensor `name` of a file, and its shape.
fn get(t: &Tensors, name: &str) -> (Vec<u64>, Vec<f32>) {
    let (dtype, shape, bytes) = t
        .get(name)
        .unwrap_or_else(|| panic!("no `{name}` in {:?}", t.keys().collect::<Vec<_>>()));
    assert_eq!(dtype, "F32", "{name}");
    (shape.clone(), f32s(bytes))
}

/// The program's parameters (dmc's weights file names).
const PARAMS: &[&str] = &[
    "wte.weight",
    "wpe.weight",
    "ln1.weight",
    "ln1.bias",
    "att1.qkv_weight",
    "att1.qkv_bias",
    "att1.out_weight",
    "att1.out_bias",
    "ln2.weight",
    "ln2.bias",
    "att2.qkv_weight",
    "att2.out_weight",
    "fc1.weight",
    "fc1.bias",
    "fc2.weight",
    "fc2.bias",
    "lnf.weight",
    "lnf.bias",
    "head.bias",
];

#[test]
fn gpt_weights_round_trip_through_both_frameworks() {
    let dir = tempfile::tempdir().unwrap();
    let program = write_program(dir.path(), "gpt.dm", &gpt(32, 8, true));
    let w = dir.path().join("w.safetensors");
    trained(&program, &w);
    let ours = tensors(&w);
    assert_eq!(
        ours.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        PARAMS.iter().copied().collect(),
        "the program's parameters"
    );

    // PyTorch: every parameter under nn.MultiheadAttention's / nn.Embedding's names, plus the
    // tied head's weight (the embedding's table again, as a tied model's state_dict has it).
    let t = dir.path().join("torch.safetensors");
    let table = export(&program, &w, "torch", &t, None);
    let theirs = tensors(&t);
    let want: BTreeSet<&str> = [
        "wte.weight",
        "wpe.weight",
        "ln1.weight",
        "ln1.bias",
        "att1.in_proj_weight",
        "att1.in_proj_bias",
        "att1.out_proj.weight",
        "att1.out_proj.bias",
        "ln2.weight",
        "ln2.bias",
        "att2.in_proj_weight",
        "att2.out_proj.weight",
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
        "lnf.weight",
        "lnf.bias",
        "head.weight",
        "head.bias",
    ]
    .into_iter()
    .collect();
    assert_eq!(
        theirs.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        want,
        "{table}"
    );
    assert_eq!(theirs["head.weight"], ours["wte.weight"]);
    assert_eq!(theirs["wpe.weight"], ours["wpe.weight"]);
    assert_eq!(theirs["att1.in_proj_bias"], ours["att1.qkv_bias"]);
    assert_eq!(get(&theirs, "att1.in_proj_weight").0, vec![48, 16]);

    // Keras: MultiHeadAttention's query / key / value / attention_output sub-layers; the tied
    // head keeps only its bias (Keras holds a tied table once).
    let k = dir.path().join("keras.safetensors");
    let table = export(&program, &w, "keras", &k, None);
    let keras = tensors(&k);
    for (name, shape) in [
        ("wte/embeddings", vec![32, 16]),
        ("wpe/embeddings", vec![8, 16]),
        ("att1/query/kernel", vec![16, 4, 4]),
        ("att1/key/bias", vec![4, 4]),
        ("att1/attention_output/kernel", vec![4, 4, 16]),
        ("att1/attention_output/bias", vec![16]),
        ("att2/value/kernel", vec![16, 2, 8]),
        ("att2/attention_output/kernel", vec![2, 8, 16]),
        ("fc1/kernel", vec![16, 24]),
        ("head/bias", vec![32]),
    ] {
        assert_eq!(get(&keras, name).0, shape, "{name}\n{table}");
    }
    assert!(!keras.contains_key("att2/query/bias"), "{table}");
    assert!(!keras.contains_key("head/kernel"), "{table}");
    // 4 tensors of att1 became 8, 2 of att2 became 4.
    assert_eq!(keras.len(), ours.len() + 4 + 2, "{table}");

    // Both come back bit for bit.
    for (fw, file) in [("torch", &t), ("keras", &k)] {
        let back = dir.path().join(format!("{fw}.back.safetensors"));
        import(&program, file, fw, &back);
        assert!(
            std::fs::read(&back).unwrap() == std::fs::read(&w).unwrap(),
            "{fw}"
        );
    }
}

/// A PyTorch state_dict as a hand-written GPT would have it (`nn.Embedding`, a bare
/// `nn.Parameter` `[1, t, d]` of positions, `nn.MultiheadAttention`, an `nn.Sequential` MLP, a
/// tied `lm_head`), with values made here; and the dmc tensors its layouts give.
fn torch_gpt() -> (Tensors, BTreeMap<&'static str, Vec<f32>>) {
    let mut t = Tensors::new();
    let mut want = BTreeMap::new();
    let mut k = 0;
    let mut next = |n: usize| {
        k += 1;
        values(k, n)
    };
    let table = next(32 * 16);
    put(&mut t, "tok_emb.weight", &[32, 16], &table);
    want.insert("wte.weight", table.clone());
    let pos = next(8 * 16);
    put(&mut t, "pos_embed", &[1, 8, 16], &pos);
    want.insert("wpe.weight", pos);
    for (block, ln, att, bias) in [(0, "ln1", "att1", true), (1, "ln2", "att2", false)] {
        let (g, b) = (next(16), next(16));
        put(&mut t, &format!("blocks.{block}.ln.weight"), &[16], &g);
        put(&mut t, &format!("blocks.{block}.ln.bias"), &[16], &b);
        want.insert(
            if ln == "ln1" {
                "ln1.weight"
            } else {
                "ln2.weight"
            },
            g,
        );
        want.insert(if ln == "ln1" { "ln1.bias" } else { "ln2.bias" }, b);
        let a = format!("blocks.{block}.attn");
        // in_proj_weight [3d, d]: row r is qkv_weight's column r.
        let in_proj = next(48 * 16);
        put(&mut t, &format!("{a}.in_proj_weight"), &[48, 16], &in_proj);
        let out_proj = next(16 * 16);
        put(
            &mut t,
            &format!("{a}.out_proj.weight"),
            &[16, 16],
            &out_proj,
        );
        let (qkv_w, out_w, qkv_b, out_b) = if att == "att1" {
            (
                "att1.qkv_weight",
                "att1.out_weight",
                "att1.qkv_bias",
                "att1.out_bias",
            )
        } else {
            (
                "att2.qkv_weight",
                "att2.out_weight",
                "att2.qkv_bias",
                "att2.out_bias",
            )
        };
        let mut qkv = vec![0.0; 16 * 48];
        for r in 0..48 {
            for c in 0..16 {
                qkv[c * 48 + r] = in_proj[r * 16 + c];
            }
        }
        want.insert(qkv_w, qkv);
        want.insert(out_w, transpose(&out_proj, 16, 16));
        if bias {
            let (ib, ob) = (next(48), next(16));
            put(&mut t, &format!("{a}.in_proj_bias"), &[48], &ib);
            put(&mut t, &format!("{a}.out_proj.bias"), &[16], &ob);
            want.insert(qkv_b, ib);
            want.insert(out_b, ob);
        }
    }
    let (w0, b0, w2, b2) = (next(24 * 16), next(24), next(16 * 24), next(16));
    put(&mut t, "mlp.0.weight", &[24, 16], &w0);
    put(&mut t, "mlp.0.bias", &[24], &b0);
    put(&mut t, "mlp.2.weight", &[16, 24], &w2);
    put(&mut t, "mlp.2.bias", &[16], &b2);
    want.insert("fc1.weight", transpose(&w0, 24, 16));
    want.insert("fc1.bias", b0);
    want.insert("fc2.weight", transpose(&w2, 16, 24));
    want.insert("fc2.bias", b2);
    let (g, b) = (next(16), next(16));
    put(&mut t, "ln_f.weight", &[16], &g);
    put(&mut t, "ln_f.bias", &[16], &b);
    want.insert("lnf.weight", g);
    want.insert("lnf.bias", b);
    // tied: lm_head.weight is tok_emb.weight
    put(&mut t, "lm_head.weight", &[32, 16], &table);
    let hb = next(32);
    put(&mut t, "lm_head.bias", &[32], &hb);
    want.insert("head.bias", hb);
    (t, want)
}

fn assert_imported(w: &Path, want: &BTreeMap<&'static str, Vec<f32>>, what: &str) {
    let got = tensors(w);
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: every parameter, nothing else"
    );
    for (name, v) in want {
        assert!(get(&got, name).1 == *v, "{what}: `{name}`");
    }
}

#[test]
fn torch_layouts_are_the_ones_written_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let program = write_program(dir.path(), "gpt.dm", &gpt(32, 8, true));
    let (file, want) = torch_gpt();
    let f = dir.path().join("torch.safetensors");
    write_safetensors(&f, &file);
    let w = dir.path().join("w.safetensors");
    let table = import(&program, &f, "torch", &w);
    assert_imported(&w, &want, "hand-built state_dict");
    // The table names every tensor of the file once.
    for name in file.keys() {
        let rows = table
            .lines()
            .filter(|l| l.starts_with(&format!("{name} ")))
            .count();
        assert_eq!(rows, 1, "`{name}`:\n{table}");
    }
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap()
            .to_string()
    };
    assert!(
        row("blocks.0.attn.in_proj_weight").contains("att1.qkv_weight"),
        "{table}"
    );
    assert!(
        row("blocks.1.attn.out_proj.weight").contains("att2.out_weight"),
        "{table}"
    );
    assert!(row("pos_embed").contains("wpe.weight"), "{table}");
    assert!(
        row("lm_head.weight").contains("wte.weight") && row("lm_head.weight").contains("tied"),
        "{table}"
    );

    // Export like the file: its names, its shapes (the [1, t, d] parameter), its values.
    let e = dir.path().join("export.safetensors");
    export(&program, &w, "torch", &e, Some(&f));
    assert!(
        tensors(&e) == file,
        "export --like gives back the hand-built file"
    );

    // Without --like, dmc's names: in_proj_weight's rows are qkv_weight's columns.
    let e = dir.path().join("plain.safetensors");
    export(&program, &w, "torch", &e, None);
    let plain = tensors(&e);
    let (shape, in_proj) = get(&plain, "att1.in_proj_weight");
    assert_eq!(shape, vec![48, 16]);
    let qkv = &want["att1.qkv_weight"];
    for r in 0..48 {
        for c in 0..16 {
            assert_eq!(in_proj[r * 16 + c], qkv[c * 48 + r], "row {r} column {c}");
        }
    }
    assert_eq!(get(&plain, "wpe.weight").0, vec![8, 16]);
}

#[test]
fn keras_attention_joins_query_key_value_as_written_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let program = write_program(dir.path(), "gpt.dm", &gpt(32, 8, true));
    // Keras 3 `v.path` names: Embedding, a position embedding layer, LayerNormalization,
    // MultiHeadAttention (EinsumDense sub-layers), Dense, a tied head's own bias.
    let mut t = Tensors::new();
    let mut want: BTreeMap<&str, Vec<f32>> = BTreeMap::new();
    let mut k = 100;
    let mut next = |n: usize| {
        k += 1;
        values(k, n)
    };
    let emb = next(32 * 16);
    put(&mut t, "embedding/embeddings", &[32, 16], &emb);
    want.insert("wte.weight", emb);
    let pos = next(8 * 16);
    put(&mut t, "position_embedding/embeddings", &[8, 16], &pos);
    want.insert("wpe.weight", pos);
    let lns = [
        ("layer_normalization", "ln1"),
        ("layer_normalization_1", "ln2"),
        ("layer_normalization_2", "lnf"),
    ];
    for (keras, ours) in lns {
        let (g, b) = (next(16), next(16));
        put(&mut t, &format!("{keras}/gamma"), &[16], &g);
        put(&mut t, &format!("{keras}/beta"), &[16], &b);
        want.insert(
            if ours == "ln1" {
                "ln1.weight"
            } else if ours == "ln2" {
                "ln2.weight"
            } else {
                "lnf.weight"
            },
            g,
        );
        want.insert(
            if ours == "ln1" {
                "ln1.bias"
            } else if ours == "ln2" {
                "ln2.bias"
            } else {
                "lnf.bias"
            },
            b,
        );
    }
    for (mha, heads, bias, att) in [
        ("multi_head_attention", 4usize, true, 1),
        ("multi_head_attention_1", 2, false, 2),
    ] {
        let dh = 16 / heads;
        let mut qkv = vec![0.0; 16 * 48];
        let mut qkv_b = vec![0.0; 48];
        for (part, sub) in ["query", "key", "value"].iter().enumerate() {
            // kernel [d, heads, dh]: qkv_weight[i][part*16 + h*dh + j] = kernel[i][h][j]
            let kern = next(16 * heads * dh);
            put(
                &mut t,
                &format!("{mha}/{sub}/kernel"),
                &[16, heads as u64, dh as u64],
                &kern,
            );
            for i in 0..16 {
                for h in 0..heads {
                    for j in 0..dh {
                        qkv[i * 48 + part * 16 + h * dh + j] = kern[(i * heads + h) * dh + j];
                    }
                }
            }
            if bias {
                let b = next(heads * dh);
                put(
                    &mut t,
                    &format!("{mha}/{sub}/bias"),
                    &[heads as u64, dh as u64],
                    &b,
                );
                for h in 0..heads {
                    for j in 0..dh {
                        qkv_b[part * 16 + h * dh + j] = b[h * dh + j];
                    }
                }
            }
        }
        // attention_output kernel [heads, dh, d]: out_weight[h*dh + j][o] = kernel[h][j][o]
        let out = next(16 * 16);
        put(
            &mut t,
            &format!("{mha}/attention_output/kernel"),
            &[heads as u64, dh as u64, 16],
            &out,
        );
        let mut out_w = vec![0.0; 16 * 16];
        for h in 0..heads {
            for j in 0..dh {
                for o in 0..16 {
                    out_w[(h * dh + j) * 16 + o] = out[(h * dh + j) * 16 + o];
                }
            }
        }
        let names = if att == 1 {
            [
                "att1.qkv_weight",
                "att1.out_weight",
                "att1.qkv_bias",
                "att1.out_bias",
            ]
        } else {
            [
                "att2.qkv_weight",
                "att2.out_weight",
                "att2.qkv_bias",
                "att2.out_bias",
            ]
        };
        want.insert(names[0], qkv);
        want.insert(names[1], out_w);
        if bias {
            let ob = next(16);
            put(&mut t, &format!("{mha}/attention_output/bias"), &[16], &ob);
            want.insert(names[2], qkv_b);
            want.insert(names[3], ob);
        }
    }
    let (k1, b1, k2, b2) = (next(16 * 24), next(24), next(24 * 16), next(16));
    put(&mut t, "dense/kernel", &[16, 24], &k1);
    put(&mut t, "dense/bias", &[24], &b1);
    put(&mut t, "dense_1/kernel", &[24, 16], &k2);
    put(&mut t, "dense_1/bias", &[16], &b2);
    want.insert("fc1.weight", k1);
    want.insert("fc1.bias", b1);
    want.insert("fc2.weight", k2);
    want.insert("fc2.bias", b2);
    let hb = next(32);
    put(&mut t, "head/bias", &[32], &hb);
    want.insert("head.bias", hb);

    let f = dir.path().join("keras.safetensors");
    write_safetensors(&f, &t);
    let w = dir.path().join("w.safetensors");
    let table = import(&program, &f, "keras", &w);
    assert_imported(&w, &want, &format!("hand-built Keras weights\n{table}"));
    let e = dir.path().join("export.safetensors");
    export(&program, &w, "keras", &e, Some(&f));
    assert!(tensors(&e) == t, "export --like gives back the Keras file");

    // A tied head's Keras kernel [dim, vocab] must be the table transposed.
    let mut tied = t.clone();
    let table_t = transpose(&want["wte.weight"], 32, 16);
    put(&mut tied, "head/kernel", &[16, 32], &table_t);
    write_safetensors(&f, &tied);
    let w2 = dir.path().join("w2.safetensors");
    import(&program, &f, "keras", &w2);
    assert!(std::fs::read(&w2).unwrap() == std::fs::read(&w).unwrap());
    put(&mut tied, "head/kernel", &[16, 32], &values(999, 32 * 16));
    write_safetensors(&f, &tied);
    let err = import_err(&program, &f, "keras", &dir.path().join("w3.safetensors"));
    assert!(
        err.contains("`head/kernel`") && err.contains("differs from the embedding table"),
        "{err}"
    );
}

#[test]
fn a_tied_heads_weight_is_the_table_or_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let program = write_program(dir.path(), "gpt.dm", &gpt(32, 8, true));
    let (file, want) = torch_gpt();
    let f = dir.path().join("f.safetensors");
    let w = dir.path().join("w.safetensors");
    // `safetensors.torch.save_model` keeps one name of a shared tensor: either may be left.
    for drop in ["lm_head.weight", "tok_emb.weight"] {
        let mut t = file.clone();
        t.remove(drop);
        write_safetensors(&f, &t);
        let _ = std::fs::remove_file(&w);
        let table = import(&program, &f, "torch", &w);
        assert_imported(&w, &want, &format!("without `{drop}`\n{table}"));
    }
    // A head weight that is not the table: the program ties them, so the file is refused.
    let mut t = file.clone();
    put(&mut t, "lm_head.weight", &[32, 16], &values(77, 32 * 16));
    write_safetensors(&f, &t);
    let err = import_err(&program, &f, "torch", &dir.path().join("x.safetensors"));
    assert!(
        err.contains("`lm_head.weight`")
            && err.contains("differs from the embedding table `wte.weight`")
            && err.contains("ties them"),
        "{err}"
    );

    // A head without bias: nothing of its own, the file's copy of the table is optional.
    let program = write_program(dir.path(), "nobias.dm", &gpt(32, 8, false));
    let mut t = file.clone();
    t.remove("lm_head.bias");
    let mut want = want.clone();
    want.remove("head.bias");
    for with_copy in [true, false] {
        if !with_copy {
            t.remove("lm_head.weight");
        }
        write_safetensors(&f, &t);
        let _ = std::fs::remove_file(&w);
        import(&program, &f, "torch", &w);
        assert_imported(&w, &want, &format!("no bias, copy {with_copy}"));
    }
}

#[test]
fn equal_shaped_tables_are_told_apart_by_their_names() {
    // vocab = t: the token table, the position table and the tied head's copy are all [8, 16];
    // GPT-2's names (`wte`, `wpe`, `lm_head`) sort `lm_head` < `transformer.wpe` <
    // `transformer.wte`, the reverse of the program's order.
    let dir = tempfile::tempdir().unwrap();
    let program = write_program(dir.path(), "gpt.dm", &gpt(8, 8, false));
    let w = dir.path().join("w.safetensors");
    trained(&program, &w);
    let t = dir.path().join("torch.safetensors");
    export(&program, &w, "torch", &t, None);
    let gpt2 = |name: &str| -> String {
        match name.split_once('.').unwrap() {
            ("head", leaf) => format!("lm_head.{leaf}"),
            ("att1", leaf) => format!("transformer.h.0.attn.{leaf}"),
            ("att2", leaf) => format!("transformer.h.1.attn.{leaf}"),
            ("ln1", leaf) => format!("transformer.h.0.ln_1.{leaf}"),
            ("ln2", leaf) => format!("transformer.h.1.ln_1.{leaf}"),
            ("fc1", leaf) => format!("transformer.h.1.mlp.c_fc.{leaf}"),
            ("fc2", leaf) => format!("transformer.h.1.mlp.c_proj.{leaf}"),
            ("lnf", leaf) => format!("transformer.ln_f.{leaf}"),
            (m, leaf) => format!("transformer.{m}.{leaf}"),
        }
    };
    let renamed: Tensors = tensors(&t)
        .into_iter()
        .map(|(n, v)| (gpt2(&n), v))
        .collect();
    for keep_head in [true, false] {
        let mut file = renamed.clone();
        if !keep_head {
            file.remove("lm_head.weight");
        }
        let f = dir.path().join(format!("gpt2_{keep_head}.safetensors"));
        write_safetensors(&f, &file);
        let back = dir.path().join(format!("back_{keep_head}.safetensors"));
        let table = import(&program, &f, "torch", &back);
        assert!(
            std::fs::read(&back).unwrap() == std::fs::read(&w).unwrap(),
            "lm_head.weight kept: {keep_head}\n{table}"
        );
        let row = |name: &str| {
            table
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{table}"))
                .to_string()
        };
        // the token table had the position table (and the head's copy) to choose from
        let wte = row("transformer.wte.weight");
        assert!(
            wte.contains("-> wte.weight") && wte.contains("name hint"),
            "{table}"
        );
        assert!(
            row("transformer.wpe.weight").contains("-> wpe.weight"),
            "{table}"
        );
    }
}

#[test]
fn attention_files_dmc_cannot_take_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let program = write_program(dir.path(), "gpt.dm", &gpt(32, 8, true));
    let (file, _) = torch_gpt();
    let f = dir.path().join("f.safetensors");
    let out = dir.path().join("o.safetensors");
    // nn.MultiheadAttention(kdim=..., vdim=...): separate projection weights.
    let mut t = file.clone();
    let v = get(&t, "blocks.0.attn.in_proj_weight").1;
    t.remove("blocks.0.attn.in_proj_weight");
    put(&mut t, "blocks.0.attn.q_proj_weight", &[16, 16], &v[..256]);
    put(
        &mut t,
        "blocks.0.attn.k_proj_weight",
        &[16, 16],
        &v[256..512],
    );
    put(&mut t, "blocks.0.attn.v_proj_weight", &[16, 16], &v[512..]);
    write_safetensors(&f, &t);
    let err = import_err(&program, &f, "torch", &out);
    assert!(
        err.contains("_proj_weight`") && err.contains("separate query / key / value"),
        "{err}"
    );
    // An attention of separate Linear layers: no module fits the layer, and the message says
    // what dmc's attention is in PyTorch.
    let mut t = file.clone();
    for (leaf, a, b) in [("q", 0, 256), ("k", 256, 512), ("v", 512, 768)] {
        put(
            &mut t,
            &format!("blocks.0.attn.{leaf}.weight"),
            &[16, 16],
            &v[a..b],
        );
        let bias = get(&file, "blocks.0.attn.in_proj_bias").1;
        put(
            &mut t,
            &format!("blocks.0.attn.{leaf}.bias"),
            &[16],
            &bias[a / 16..b / 16],
        );
    }
    t.remove("blocks.0.attn.in_proj_weight");
    t.remove("blocks.0.attn.in_proj_bias");
    write_safetensors(&f, &t);
    let err = import_err(&program, &f, "torch", &out);
    assert!(
        err.contains("no module fits layer `att1`")
            && err.contains("nn.MultiheadAttention")
            && err.contains("in_proj_weight"),
        "{err}"
    );
    // A position table of another length.
    let mut t = file.clone();
    put(&mut t, "pos_embed", &[1, 16, 16], &values(5, 256));
    write_safetensors(&f, &t);
    let err = import_err(&program, &f, "torch", &out);
    assert!(
        err.contains("no module fits layer `wpe`") && err.contains("[1,8,16]"),
        "{err}"
    );
}
