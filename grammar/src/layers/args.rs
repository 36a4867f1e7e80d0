//! A layer's signature (its arguments with their kinds and defaults) and the typed values a
//! builder reads after the checker has bound a call to it.

use crate::diag::{Error, Kind};
use crate::model::{Activation, Initializer, Padding, Span};

/// What an argument accepts, and how the checker reads a written value for it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgKind {
    /// A whole number, at least 1 (`filters`, `size`, ...).
    Count,
    /// A whole number, at least 0 (a pool's `padding`).
    Natural,
    /// A whole number at least 1, or a pair of them `(height, width)` (`kernel: (1, 7)`, `stride`,
    /// `dilation`).
    Pair,
    /// A convolution's padding: one of these bare words (`same`, `valid`), a whole number >= 0 for
    /// every side, a pair `(height, width)` (each on both sides of its axis) or four numbers
    /// `(top, bottom, left, right)`.
    Padding(&'static [&'static str]),
    /// A number (`p`).
    Number,
    /// `true` or `false`.
    Flag,
    /// One of these bare words (`padding: same`).
    Choice(&'static [&'static str]),
    /// `none` or an activation's name (`activation: relu`).
    Activation,
    /// An initialiser (`init: he_normal`, `init: normal(std: 0.02)`).
    Init,
    /// A shape `[d1, d2, ...]` of whole numbers >= 1, one of them possibly `-1` (`reshape`).
    Shape,
    /// A value of the program computed by a layer (`dense`'s `tie: e`, `e` an embedding's output),
    /// or `none`.
    Value,
}

/// A bound argument's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgValue {
    Count(usize),
    Natural(usize),
    Pair(usize, usize),
    Padding(Padding),
    Number(f64),
    Flag(bool),
    Choice(&'static str),
    /// `None` for `activation: none`.
    Activation(Option<Activation>),
    /// `None`: dmc's default initialiser.
    Init(Option<Initializer>),
    Shape(Dims),
    /// The model node (`ValueRef::Node`) of a layer's output; `None`: `none`.
    Value(Option<usize>),
}

/// The most dimensions a written shape (`reshape([...])`) may have.
pub const MAX_RANK: usize = 8;

/// A written shape: up to [`MAX_RANK`] dimensions, each >= 1 or `-1` (inferred).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    len: usize,
    d: [i64; MAX_RANK],
}

impl Dims {
    /// `None` with more than [`MAX_RANK`] dimensions.
    pub fn new(dims: &[i64]) -> Option<Dims> {
        let mut d = [0; MAX_RANK];
        d.get_mut(..dims.len())?.copy_from_slice(dims);
        Some(Dims { len: dims.len(), d })
    }
    pub fn as_slice(&self) -> &[i64] {
        &self.d[..self.len]
    }
    /// As the language writes it: `[4, -1]`.
    pub fn text(&self) -> String {
        let parts: Vec<String> = self.as_slice().iter().map(|d| d.to_string()).collect();
        format!("[{}]", parts.join(", "))
    }
}

/// The value an argument has when the call does not give it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ArgDefault {
    /// The argument must be given.
    Required,
    Value(ArgValue),
    /// The value of an earlier argument (`maxpool`'s `stride` defaults to its `size`).
    SameAs(&'static str),
}

/// One argument of a layer's signature.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Param {
    pub name: &'static str,
    pub kind: ArgKind,
    pub default: ArgDefault,
}

impl Param {
    /// An argument the call must give.
    pub const fn required(name: &'static str, kind: ArgKind) -> Param {
        Param {
            name,
            kind,
            default: ArgDefault::Required,
        }
    }

    /// An argument with a default value.
    pub const fn optional(name: &'static str, kind: ArgKind, default: ArgValue) -> Param {
        Param {
            name,
            kind,
            default: ArgDefault::Value(default),
        }
    }

    /// An argument that defaults to the value of an earlier one.
    pub const fn same_as(name: &'static str, kind: ArgKind, other: &'static str) -> Param {
        Param {
            name,
            kind,
            default: ArgDefault::SameAs(other),
        }
    }

    /// The default as the language reference writes it (`1`, `same`, `none`, `size`); `None` for a
    /// required argument.
    pub fn default_text(&self) -> Option<String> {
        match self.default {
            ArgDefault::Required => None,
            ArgDefault::SameAs(other) => Some(other.to_string()),
            ArgDefault::Value(v) => Some(match v {
                ArgValue::Count(n) | ArgValue::Natural(n) => n.to_string(),
                ArgValue::Pair(a, b) if a == b => a.to_string(),
                ArgValue::Pair(a, b) => format!("({a}, {b})"),
                ArgValue::Padding(p) => match p {
                    Padding::Same => "same".into(),
                    Padding::Valid => "valid".into(),
                    Padding::Explicit {
                        top,
                        bottom,
                        left,
                        right,
                    } if top == bottom && left == right && top == left => top.to_string(),
                    Padding::Explicit {
                        top,
                        bottom,
                        left,
                        right,
                    } => format!("({top}, {bottom}, {left}, {right})"),
                },
                ArgValue::Number(x) => format!("{x:?}"),
                ArgValue::Flag(b) => b.to_string(),
                ArgValue::Choice(c) => c.to_string(),
                ArgValue::Activation(a) => a.map_or("none", Activation::name).to_string(),
                ArgValue::Init(i) => i.map_or("default".to_string(), Initializer::text),
                ArgValue::Shape(d) => d.text(),
                ArgValue::Value(v) => v.map_or("none".to_string(), |i| format!("node {i}")),
            }),
        }
    }
}

/// The arguments of one call, bound to the layer's signature and read by kind (defaults filled
/// in), in the signature's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Args {
    /// The call's span.
    pub call: Span,
    /// Each argument with where it was written (`None`: the default).
    pub vals: Vec<(&'static str, ArgValue, Option<Span>)>,
}

impl Args {
    fn get(&self, k: &str) -> Result<ArgValue, Error> {
        match self.vals.iter().find(|(n, _, _)| *n == k) {
            Some((_, v, _)) => Ok(*v),
            None => Err(self.mismatch(k)),
        }
    }

    /// A builder read an argument its signature does not declare with that kind: a defect of the
    /// table (its tests build every entry), reported rather than panicking.
    fn mismatch(&self, k: &str) -> Error {
        Error::new(
            Kind::Argument,
            self.call,
            format!("internal error: the layer table has no argument `{k}` of this kind"),
        )
        .label("while checking this call")
    }

    /// Where argument `k` was written, or the call's span when it was not.
    pub fn span(&self, k: &str) -> Span {
        self.vals
            .iter()
            .find(|(n, _, _)| *n == k)
            .and_then(|(_, _, s)| *s)
            .unwrap_or(self.call)
    }

    pub fn count(&self, k: &str) -> Result<usize, Error> {
        match self.get(k)? {
            ArgValue::Count(n) => Ok(n),
            _ => Err(self.mismatch(k)),
        }
    }

    pub fn natural(&self, k: &str) -> Result<usize, Error> {
        match self.get(k)? {
            ArgValue::Natural(n) => Ok(n),
            _ => Err(self.mismatch(k)),
        }
    }

    /// A [`ArgKind::Pair`] argument as (height, width).
    pub fn pair(&self, k: &str) -> Result<(usize, usize), Error> {
        match self.get(k)? {
            ArgValue::Pair(a, b) => Ok((a, b)),
            _ => Err(self.mismatch(k)),
        }
    }

    pub fn padding(&self, k: &str) -> Result<Padding, Error> {
        match self.get(k)? {
            ArgValue::Padding(p) => Ok(p),
            _ => Err(self.mismatch(k)),
        }
    }

    pub fn number(&self, k: &str) -> Result<f64, Error> {
        match self.get(k)? {
            ArgValue::Number(x) => Ok(x),
            _ => Err(self.mismatch(k)),
        }
    }

    pub fn flag(&self, k: &str) -> Result<bool, Error> {
        match self.get(k)? {
            ArgValue::Flag(b) => Ok(b),
            _ => Err(self.mismatch(k)),
        }
    }

    pub fn choice(&self, k: &str) -> Result<&'static str, Error> {
        match self.get(k)? {
            ArgValue::Choice(c) => Ok(c),
            _ => Err(self.mismatch(k)),
        }
    }

    /// An [`ArgKind::Init`] argument, `None` when not given (dmc's default).
    pub fn init(&self, k: &str) -> Option<Initializer> {
        match self.vals.iter().find(|(n, _, _)| *n == k) {
            Some((_, ArgValue::Init(i), _)) => *i,
            _ => None,
        }
    }

    /// The model node of a value argument (`None`: `none`).
    pub fn value(&self, k: &str) -> Result<Option<usize>, Error> {
        match self.get(k)? {
            ArgValue::Value(v) => Ok(v),
            _ => Err(self.mismatch(k)),
        }
    }

    pub fn dims(&self, k: &str) -> Result<Dims, Error> {
        match self.get(k)? {
            ArgValue::Shape(d) => Ok(d),
            _ => Err(self.mismatch(k)),
        }
    }

    pub fn activation(&self, k: &str) -> Result<Option<Activation>, Error> {
        match self.get(k)? {
            ArgValue::Activation(a) => Ok(a),
            _ => Err(self.mismatch(k)),
        }
    }
}
