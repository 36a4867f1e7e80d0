//! Sequence models from the command line: next-token windows of a text corpus (sample and label
//! counts, the label shift, refusals), tokens outside the embedding, and `dmc sample` (seeded,
//! greedy at temperature 0, refusing models it cannot sample).

use crate::common::dmc;

/// A byte-level GPT of one block (`vocab` tokens, T = 8) in `dir`; its path.
fn program(dir: &std::path::Path, vocab: usize, causal: bool) -> String {
    let src = format!(
        "input tokens: int[8]
target next: int[8]
e = tokens |> embedding({vocab}, 16)
x = e |> pos_embedding
h = x + (x |> layernorm |> attention(2, causal: {causal}))
logits = h |> layernorm |> dense({vocab}, tie: e)
loss cross_entropy(logits, next)
train {{ batch: 2, optimizer: adam(lr: 0.01), seed: 3 }}
"
    );
    let p = dir.join(format!("gpt{vocab}{causal}.dm"));
    std::fs::write(&p, src).expect("write program");
    p.display().to_string()
}

fn summary(dir: &std::path::Path) -> serde_json::Value {
    let s = std::fs::read_to_string(dir.join("summary.json")).expect("summary");
    serde_json::from_str(&s).expect("json")
}

#[test]
fn a_text_corpus_makes_next_byte_windows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = program(dir.path(), 256, true);
    // 8 * 5 + 1 bytes: 5 windows of 8 and the byte after the last
    let text: Vec<u8> = (0..41u8).map(|i| b'a' + i % 26).collect();
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, &text).expect("corpus");
    let sj = dir.path().join("summary.json");
    let (code, _, err) = dmc(&[
        "run",
        &p,
        "--data",
        &corpus.display().to_string(),
        "--steps",
        "4",
        "--summary-json",
        &sj.display().to_string(),
        "--device",
        "cpu",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("on 5 samples"), "{err}");
    let v = summary(dir.path());
    assert!(v["final_loss"].as_f64().is_some_and(f64::is_finite), "{v}");
    // one byte short of a sixth window: still 5; one window needs T + 1 bytes
    std::fs::write(&corpus, &text[..8]).expect("corpus");
    let (code, _, err) = dmc(&[
        "run",
        &p,
        "--data",
        &corpus.display().to_string(),
        "--steps",
        "1",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("at least 9"), "{err}");
}

#[test]
fn a_text_corpus_needs_a_token_program_and_tokens_inside_the_embedding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(
        &corpus,
        "hello, world: a corpus of bytes ~ beyond 64".repeat(4),
    )
    .expect("corpus");
    let c = corpus.display().to_string();
    // bytes up to 'w' (119) and '~' (126) are not tokens of a 64-row embedding
    let p = program(dir.path(), 64, true);
    let (code, _, err) = dmc(&["run", &p, "--data", &c, "--steps", "1"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("is not a token of the program's embedding (vocab 64"),
        "{err}"
    );
    // a float-input program
    let mlp = dir.path().join("mlp.dm");
    std::fs::write(&mlp, "input x: [8]\ntarget y: [1]\nout = x |> dense(1)\nloss mse(out, y)\ntrain { batch: 2, optimizer: sgd }\n").expect("write");
    let (code, _, err) = dmc(&[
        "run",
        &mlp.display().to_string(),
        "--data",
        &c,
        "--steps",
        "1",
    ]);
    assert_eq!(code, 1);
    assert!(
        err.contains("next-token windows feed an integer input `int[T]`"),
        "{err}"
    );
}

#[test]
fn sample_is_seeded_greedy_at_temperature_zero_and_refuses_other_models() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = program(dir.path(), 256, true);
    let w = dir.path().join("w.safetensors").display().to_string();
    let (code, _, err) = dmc(&["run", &p, "--steps", "3", "--save", &w, "--device", "cpu"]);
    assert_eq!(code, 0, "{err}");
    let sample = |extra: &[&str]| {
        let mut args = vec![
            "sample", &p, "--init", &w, "--prompt", "abc", "--tokens", "20",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = dmc(&args);
        assert_eq!(code, 0, "{err}");
        out
    };
    let a = sample(&["--seed", "5"]);
    assert!(a.starts_with("abc") && a.len() > 3, "{a:?}");
    assert_eq!(
        a,
        sample(&["--seed", "5"]),
        "the same seed gives the same text"
    );
    let greedy = sample(&["--temperature", "0", "--seed", "1"]);
    assert_eq!(
        greedy,
        sample(&["--temperature", "0", "--seed", "2"]),
        "greedy ignores the seed"
    );
    // a model whose attention sees later positions cannot be sampled a byte at a time
    let full = program(dir.path(), 256, false);
    let (code, _, err) = dmc(&["sample", &full, "--init", &w, "--prompt", "a"]);
    assert_eq!(code, 1);
    assert!(err.contains("is not causal"), "{err}");
    // nor one over another vocabulary than bytes
    let small = program(dir.path(), 64, true);
    let (code, _, err) = dmc(&["sample", &small, "--init", &w, "--prompt", "a"]);
    assert_eq!(code, 1);
    assert!(err.contains("not [8, 256]"), "{err}");
    let (code, _, err) = dmc(&[
        "sample",
        &p,
        "--init",
        &w,
        "--prompt",
        "a",
        "--temperature=-1",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("--temperature"), "{err}");
}
