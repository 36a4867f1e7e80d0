//! Mutated `.dm` programs through the checker, and accepted ones through the compiler.
//!
//! A case is a seed program (the examples and a few small programs covering every layer) with 1-4
//! mutations: a number replaced by an interesting value (0, 2^31, 2^64-1, 1e39, 1e-50, ...), a name
//! replaced by a keyword, layer or option of the language, tokens deleted, duplicated, swapped or
//! inserted, a line spliced from another program, a raw byte inserted (invalid UTF-8, a BOM, NUL).
//! The checker must return a model or a diagnostic that renders; an accepted program with at most
//! [`MAX_PLAN_LAYERS`] layers must compile in train, eval and predict modes (the IR verifier runs
//! around every pass) or fail with a compile error, never a panic, and every plan it emits must pass
//! both plan checkers.

use dmc_compiler::plan::Mode;
use dmc_compiler::{CompileError, CompileOptions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{guarded, CaseFile, Failure, Report};

/// Seed programs: the examples, and small programs that reach every layer, option and loss.
pub const SEEDS: &[&str] = &[
    include_str!("../../examples/seed.dm"),
    include_str!("../../examples/mlp.dm"),
    include_str!("../../examples/resnet_small.dm"),
    include_str!("../../examples/deep_convnet.dm"),
    "input x: [8, 8, 3]\ntarget y: int\nh = x |> conv2d(4, 3, stride: 2, padding: valid, activation: tanh) |> avgpool(2)\nout = h |> flatten |> dropout(0.5) |> dense(5, activation: gelu) |> dense(3)\nloss cross_entropy(out, y)\ntrain { batch: 4, optimizer: adamw(lr: 0.001, betas: (0.9, 0.99), weight_decay: 0.01), epochs: 2, seed: 3 }\n",
    "block res(c) {\n  h = in |> conv2d(c, 3) |> relu |> conv2d(c, 3)\n  return add(h, in) |> relu\n}\ninput x: [6, 6, 2]\ntarget y: [4]\nout = x |> conv2d(4, 1) |> repeat 2 { res(4) } |> global_avgpool |> dense(4, activation: sigmoid)\nloss mse(out, y)\ntrain { batch: 2, optimizer: sgd(lr: 0.1, momentum: 0.9, nesterov: true, weight_decay: 1e-4) }\n",
    "input a: [5]\ninput b: [5]\ntarget y: [5]\nout = a + b |> dense(5, bias: false) |> maxpool(1)\nloss mse(out, y)\ntrain { batch: 3, optimizer: adam }\n",
];

/// Programs with more layers are checked but not compiled (compiling them is slow, not wrong).
pub const MAX_PLAN_LAYERS: usize = 400;

/// Words other than the layer operations (those come from the grammar's table of layers).
const OTHER_WORDS: &[&str] = &[
    "input",
    "target",
    "block",
    "return",
    "loss",
    "train",
    "repeat",
    "as",
    "int",
    "in",
    "x",
    "y",
    "out",
    "h",
    "mse",
    "cross_entropy",
    "sgd",
    "adam",
    "adamw",
    "batch",
    "optimizer",
    "epochs",
    "seed",
    "lr",
    "momentum",
    "nesterov",
    "weight_decay",
    "betas",
    "beta1",
    "beta2",
    "eps",
    "padding",
    "same",
    "valid",
    "activation",
    "stride",
    "bias",
    "true",
    "false",
    "res",
    "c",
];

/// A word of the language: a layer operation or one of [`OTHER_WORDS`].
fn word(r: &mut ChaCha8Rng) -> &'static str {
    let ops = dmc_grammar::layers::layers();
    let i = r.random_range(0..ops.len() + OTHER_WORDS.len());
    ops.get(i)
        .map(|d| d.name)
        .unwrap_or_else(|| OTHER_WORDS[i - ops.len()])
}

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "2",
    "3",
    "7",
    "64",
    "255",
    "1024",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "99999999999999999999",
    "0.0",
    "0.5",
    "1.0",
    "1e-50",
    "1e39",
    "1e308",
    "1e-320",
    "-1",
    "-0",
    "1e",
    "0.",
    "00",
];

const PUNCT: &[&str] = &[
    "|>", "(", ")", "[", "]", "{", "}", ",", ":", "=", "+", "*", "-", ";", "\n", " ", "#", "|", ".",
];

const BYTES: &[&[u8]] = &[
    b"\xEF\xBB\xBF",
    b"\xFF",
    b"\xC3",
    b"\x00",
    b"\t",
    b"\r\n",
    "é".as_bytes(),
    "∑".as_bytes(),
    "😀".as_bytes(),
    b"\"",
];

#[derive(Clone, Copy, PartialEq)]
enum Class {
    Word,
    Number,
    Space,
    Other,
}

/// Splits a source into tokens (words, numbers, spaces, single other bytes); joining them gives it back.
fn tokens(src: &[u8]) -> Vec<Vec<u8>> {
    let class = |b: u8| {
        if b.is_ascii_alphabetic() || b == b'_' {
            Class::Word
        } else if b.is_ascii_digit() || b == b'.' {
            Class::Number
        } else if b == b' ' {
            Class::Space
        } else {
            Class::Other
        }
    };
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut prev = None;
    for &b in src {
        let c = class(b);
        let joins = match (prev, c) {
            (Some(Class::Word), Class::Word | Class::Number) => true,
            (Some(p), c) => p == c && c != Class::Other,
            _ => false,
        };
        match out.last_mut() {
            Some(last) if joins => last.push(b),
            _ => out.push(vec![b]),
        }
        prev = Some(if joins { prev.unwrap_or(c) } else { c });
    }
    out
}

fn pick<'a, T>(r: &mut ChaCha8Rng, v: &'a [T]) -> &'a T {
    &v[r.random_range(0..v.len())]
}

/// One mutated program, from the case's own seeded stream.
pub fn mutate(r: &mut ChaCha8Rng) -> Vec<u8> {
    let mut t = tokens(pick(r, SEEDS).as_bytes());
    for _ in 0..r.random_range(1..=4) {
        if t.is_empty() {
            t.push(b"x".to_vec());
        }
        let i = r.random_range(0..t.len());
        match r.random_range(0..11) {
            0 | 1 => {
                // a number where a number was (or anywhere)
                let nums: Vec<usize> = (0..t.len()).filter(|&k| t[k][0].is_ascii_digit()).collect();
                let k = if nums.is_empty() { i } else { *pick(r, &nums) };
                t[k] = pick(r, NUMBERS).as_bytes().to_vec();
            }
            2 => {
                let words: Vec<usize> = (0..t.len())
                    .filter(|&k| t[k][0].is_ascii_alphabetic())
                    .collect();
                let k = if words.is_empty() {
                    i
                } else {
                    *pick(r, &words)
                };
                t[k] = word(r).as_bytes().to_vec();
            }
            3 => {
                let n = r.random_range(1..=3).min(t.len() - i);
                t.drain(i..i + n);
            }
            4 => {
                let n = r.random_range(1..=8).min(t.len() - i);
                let dup: Vec<Vec<u8>> = t[i..i + n].to_vec();
                t.splice(i..i, dup);
            }
            5 => {
                let j = r.random_range(0..t.len());
                t.swap(i, j);
            }
            6 => t.insert(i, pick(r, PUNCT).as_bytes().to_vec()),
            7 => t.insert(i, word(r).as_bytes().to_vec()),
            8 => {
                // a line of another program, in place of this token
                let other = pick(r, SEEDS);
                let lines: Vec<&str> = other.lines().collect();
                let mut line = pick(r, &lines).as_bytes().to_vec();
                line.push(b'\n');
                t.insert(i, line);
            }
            9 if r.random_range(0..50) == 0 => {
                // very long lines and names (miette's columns, the lexer, the messages)
                let n = r.random_range(60_000..200_000);
                let piece: &[u8] = match r.random_range(0..3) {
                    0 => b" ",
                    1 => b"a",
                    _ => b"x |> ",
                };
                t.insert(i, piece.repeat(n / piece.len()));
            }
            _ => t.insert(i, pick(r, BYTES).to_vec()),
        }
    }
    t.concat()
}

/// The modes every accepted program must compile in.
pub const MODES: [Mode; 3] = [Mode::Train, Mode::Eval, Mode::Predict];

/// Compiles an accepted model in every mode; `Err` describes a failure (a panic, an internal
/// error, or a plan one of the checkers rejects).
pub fn plan_all_modes(model: &dmc_grammar::Model) -> Result<(), String> {
    for mode in MODES {
        let opts = CompileOptions {
            mode,
            verify: true,
            ..CompileOptions::default()
        };
        match guarded(|| dmc_compiler::compile(model, &opts)) {
            Err(panic) => return Err(format!("{mode:?}: panic: {panic}")),
            // A checked program must compile: the only refusal is a step too large to plan.
            Ok(Err(CompileError::TooLarge { .. })) => {}
            Ok(Err(e)) => return Err(format!("{mode:?}: {e}")),
            Ok(Ok(plan)) => {
                dmc_compiler::check_plan(&plan)
                    .map_err(|e| format!("{mode:?}: compiler's plan checker: {e}"))?;
                dmc_runtime::check_plan(&plan)
                    .map_err(|e| format!("{mode:?}: runtime's plan checker: {e}"))?;
            }
        }
    }
    Ok(())
}

/// Runs `cases` mutated programs (case `i` uses the stream `(seed, i)`) through the checker, and
/// the accepted ones (until `max_plans` of them) through [`plan_all_modes`].
pub fn run(cases: u64, max_plans: u64, seed: u64, case_file: &mut CaseFile) -> Report {
    let mut rep = Report::default();
    for i in 0..cases {
        let mut r = ChaCha8Rng::seed_from_u64(seed);
        r.set_stream(i);
        let bytes = mutate(&mut r);
        case_file.record(&bytes);
        rep.cases += 1;
        let fail = |what: String| Failure {
            target: "programs",
            case: String::from_utf8_lossy(&bytes).into_owned(),
            what,
        };
        let checked = guarded(|| {
            // What `dmc check` does with a file's bytes.
            let src = match std::str::from_utf8(&bytes) {
                Ok(s) => s,
                Err(_) => return None,
            };
            match dmc_grammar::compile_source(src, "fuzz.dm") {
                Ok(m) => Some(m),
                Err(d) => {
                    let _ = dmc_grammar::render_plain(&d);
                    None
                }
            }
        });
        let model = match checked {
            Err(panic) => {
                rep.failures.push(fail(format!("check panicked: {panic}")));
                continue;
            }
            Ok(None) => continue,
            Ok(Some(m)) => m,
        };
        rep.accepted += 1;
        if rep.planned >= max_plans || model.nodes.len() > MAX_PLAN_LAYERS {
            continue;
        }
        rep.planned += 1;
        if let Err(e) = plan_all_modes(&model) {
            rep.failures.push(fail(e));
        }
    }
    rep
}
