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

/// serde_json's `PrettyFormatter` (two spaces a level) started at nesting `level`: the bytes of a
/// value printed alone by `to_writer_pretty` with every newline followed by `2 * level` more
/// spaces, i.e. the value as it is printed at that depth of a document. (The pretty formatter's
/// own methods, with its one `has_value` flag, and its indentation written in one piece.)
struct Nested {
    level: usize,
    has_value: bool,
}

/// Spaces for [`Nested::indent`], in pieces of at most this many.
const SPACES: &[u8; 64] = &[b' '; 64];

impl Nested {
    fn indent<W: ?Sized + Write>(&self, w: &mut W) -> io::Result<()> {
        let mut n = 2 * self.level;
        while n > 0 {
            let k = n.min(SPACES.len());
            w.write_all(&SPACES[..k])?;
            n -= k;
        }
        Ok(())
    }

    fn open<W: ?Sized + Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(bracket)
    }

    fn close<W: ?Sized + Write>(&mut self, w: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.level -= 1;
        if self.has_value {
            w.write_all(b"\n")?;
            self.indent(w)?;
        }
        w.write_all(bracket)
    }

    fn item<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        w.write_all(if first { b"\n" } else { b",\n" })?;
        self.indent(w)
    }
}

impl serde_json::ser::Formatter for Nested {
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.item(w, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.open(w, b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.close(w, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.item(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// The elements of an array whose opening bracket is at nesting `depth`, as the pretty printer
/// writes them between `[\n` and `\n<indent>]`: each on its own indented lines, `,\n` between.
fn elements<T: Serialize>(
    w: &mut (impl Write + ?Sized),
    items: &[T],
    depth: usize,
) -> io::Result<()> {
    let at = Nested {
        level: depth + 1,
        has_value: false,
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            w.write_all(b",\n")?;
        }
        at.indent(w)?;
        let mut out = serde_json::Serializer::with_formatter(
            &mut *w,
            Nested {
                level: depth + 1,
                has_value: false,
            },
        );
        item.serialize(&mut out).map_err(io::Error::from)?;
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
/// top-level object, or a dotted path of fields of objects, e.g. `peak.live`) and a function
/// writing it with [`write_array`] at its depth (1 for a top-level field, 2 for `peak.live`).
pub type Part<'a> = (&'a str, &'a mut dyn FnMut(&mut dyn Write) -> io::Result<()>);

/// Writes `skeleton` (a value serialising to a JSON object) as `serde_json::to_writer_pretty`
/// does, with each `(key, write)` of `parts` written by `write` in the place of the empty array
/// the skeleton has under that key (path). `parts` in the order of the keys in the output.
pub fn write_pretty_with(
    w: &mut dyn Write,
    skeleton: &impl Serialize,
    parts: &mut [Part<'_>],
) -> io::Result<()> {
    let text = serde_json::to_vec_pretty(skeleton).map_err(io::Error::from)?;
    let mut rest: &[u8] = &text;
    for (key, write) in parts.iter_mut() {
        // A key at depth d is the only text at d indentations after a newline with this name,
        // within the object of the path's previous key (the first text after that key's).
        let mut from = 0;
        let mut end = None;
        let fields: Vec<&str> = key.split('.').collect();
        for (d, field) in fields.iter().enumerate() {
            let last = d + 1 == fields.len();
            let at = format!(
                "\n{}\"{field}\": {}",
                "  ".repeat(d + 1),
                if last { "[]" } else { "" }
            );
            let Some(i) = find(&rest[from..], at.as_bytes()) else {
                end = None;
                break;
            };
            from += i + at.len();
            end = Some(from);
        }
        let Some(end) = end else {
            return Err(io::Error::other(format!(
                "no empty array `{key}` to write in"
            )));
        };
        let bracket = end - 2;
        w.write_all(&rest[..bracket])?;
        write(w)?;
        rest = &rest[end..];
    }
    w.write_all(rest)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(haystack, needle)
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
