//! serde_json's pretty printing (`to_writer_pretty`, byte for byte) of a value with large
//! arrays, the arrays printed on two threads: a deep network's `plan.json` and `plan --json`
//! report are hundreds of MB, most of it in a few arrays (buffers, steps, the timeline).
//!
//! The value is printed with the large arrays taken out (empty, `[]`), and each of them is written
//! in the place of its `[]`: the first half of its elements straight to the writer, the second
//! half meanwhile on another thread into memory. An element is printed alone and indented to its
//! depth: serde_json's pretty printer indents each line by two spaces per level, and no string it
//! prints holds a raw newline (it escapes them), so every newline of an element's text is
//! followed by the indentation of its depth.

use std::io::{self, Write};

use serde::Serialize;

/// Arrays with more elements than this are printed on two threads.
pub const PARALLEL_ELEMENTS: usize = 2048;

/// A writer that adds `indent` after every newline it is given.
struct Indented<'a, W: Write + ?Sized> {
    inner: &'a mut W,
    indent: &'a [u8],
}

impl<W: Write + ?Sized> Write for Indented<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while let Some(i) = buf.iter().position(|&b| b == b'\n') {
            self.inner.write_all(&buf[..=i])?;
            self.inner.write_all(self.indent)?;
            buf = &buf[i + 1..];
        }
        self.inner.write_all(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The elements of an array whose opening bracket is at nesting `depth`, as the pretty printer
/// writes them between `[\n` and `\n<indent>]`: each on its own indented lines, `,\n` between.
fn elements<T: Serialize>(
    w: &mut (impl Write + ?Sized),
    items: &[T],
    depth: usize,
) -> io::Result<()> {
    let indent = vec![b' '; 2 * (depth + 1)];
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            w.write_all(b",\n")?;
        }
        w.write_all(&indent)?;
        let mut out = Indented {
            inner: w,
            indent: &indent,
        };
        serde_json::to_writer_pretty(&mut out, item).map_err(io::Error::from)?;
    }
    Ok(())
}

/// The array `items` (its opening bracket at nesting `depth`) as the pretty printer writes it.
pub fn write_array<T: Serialize + Sync>(
    w: &mut (impl Write + ?Sized),
    items: &[T],
    depth: usize,
) -> io::Result<()> {
    if items.is_empty() {
        return w.write_all(b"[]");
    }
    w.write_all(b"[\n")?;
    if items.len() <= PARALLEL_ELEMENTS {
        elements(w, items, depth)?;
    } else {
        let (first, second) = items.split_at(items.len() / 2);
        let later = std::thread::scope(|s| {
            let later = s.spawn(|| -> io::Result<Vec<u8>> {
                let mut out = Vec::new();
                elements(&mut out, second, depth)?;
                Ok(out)
            });
            let now = elements(w, first, depth);
            let later = later
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            now.and(later)
        })?;
        w.write_all(b",\n")?;
        w.write_all(&later)?;
    }
    w.write_all(b"\n")?;
    w.write_all(&vec![b' '; 2 * depth])?;
    w.write_all(b"]")
}

/// A large array of a value, taken out of it: the key the value has it under (a field of the
/// top-level object) and a function writing it with [`write_array`] at depth 1.
pub type Part<'a> = (&'a str, &'a mut dyn FnMut(&mut dyn Write) -> io::Result<()>);

/// Writes `skeleton` (a value serialising to a JSON object) as `serde_json::to_writer_pretty`
/// does, with each `(key, write)` of `parts` written by `write` in the place of the empty array
/// the skeleton has under that top-level key. `parts` in the order of the keys in the output.
pub fn write_pretty_with(
    w: &mut dyn Write,
    skeleton: &impl Serialize,
    parts: &mut [Part<'_>],
) -> io::Result<()> {
    let text = serde_json::to_vec_pretty(skeleton).map_err(io::Error::from)?;
    let mut rest: &[u8] = &text;
    for (key, write) in parts.iter_mut() {
        // A top-level key is the only text at one indentation after a newline with this name.
        let at = format!("\n  \"{key}\": []");
        let Some(i) = find(rest, at.as_bytes()) else {
            return Err(io::Error::other(format!(
                "no empty top-level array `{key}` to write in"
            )));
        };
        let bracket = i + at.len() - 2;
        w.write_all(&rest[..bracket])?;
        write(w)?;
        rest = &rest[bracket + 2..];
    }
    w.write_all(rest)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `plan` as `serde_json::to_writer_pretty` writes it, its buffers, steps, parameter and optimizer
/// state bindings each on two threads. (Taken out of `plan` meanwhile, and put back.)
pub fn write_plan(w: &mut dyn Write, plan: &mut crate::plan::Plan) -> io::Result<()> {
    let buffers = std::mem::take(&mut plan.buffers);
    let steps = std::mem::take(&mut plan.steps);
    let params = std::mem::take(&mut plan.params);
    let opt_state = std::mem::take(&mut plan.opt_state);
    let written = write_pretty_with(
        w,
        plan,
        &mut [
            ("buffers", &mut |w| write_array(w, &buffers, 1)),
            ("steps", &mut |w| write_array(w, &steps, 1)),
            ("params", &mut |w| write_array(w, &params, 1)),
            ("opt_state", &mut |w| write_array(w, &opt_state, 1)),
        ],
    );
    plan.buffers = buffers;
    plan.steps = steps;
    plan.params = params;
    plan.opt_state = opt_state;
    written
}
