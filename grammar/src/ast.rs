//! Syntax tree of a `.dm` program, as written (before block/repeat expansion and checking).
//!
//! Every node keeps the byte [`Span`] it was parsed from, so the checker can point at it.

pub use crate::model::Span;

/// A whole `.dm` file.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub items: Vec<Item>,
    /// Length of the source, used for "end of file" spans.
    pub len: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// A top-level statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// `input x: [16, 16, 1]`
    Input(Decl),
    /// `target y: [1]` or `target label: int`
    Target(Decl),
    /// `name = expr`
    Let(Let),
    /// `block name(params) { ... return expr }`
    Block(BlockDef),
    /// `loss mse(out, y)`, `loss 0.5 * mse(recon, x) + cross_entropy(logits, label)`
    Loss(LossStmt),
    /// `train { batch: 1, optimizer: sgd(lr: 0.01) }`
    Train(TrainSection),
}

/// Declared type of an input or target: `[d1, d2, ...]` (f32), `int` (i32 scalar) or `int[d, ...]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeExpr {
    pub int: bool,
    /// Dimensions with their spans (may be zero or negative as written; the checker rejects them).
    pub dims: Vec<(i64, Span)>,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Decl {
    pub name: Ident,
    pub ty: TypeExpr,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Let {
    pub name: Ident,
    pub value: Expr,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub name: Ident,
    pub default: Option<Expr>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BlockDef {
    pub name: Ident,
    pub params: Vec<Param>,
    pub body: Vec<Let>,
    pub ret: Expr,
    pub span: Span,
}

/// A `loss` statement: one or more terms joined by `+`.
#[derive(Debug, Clone, PartialEq)]
pub struct LossStmt {
    pub terms: Vec<LossCall>,
    pub span: Span,
}

/// One term of a `loss`: `[weight *] NAME(args)`.
#[derive(Debug, Clone, PartialEq)]
pub struct LossCall {
    /// The weight as written (a number literal, possibly negative: the checker rejects those).
    pub weight: Option<Expr>,
    pub func: Ident,
    pub args: Vec<Arg>,
    /// From the weight (or the name) to the closing parenthesis.
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: Ident,
    pub value: Expr,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TrainSection {
    pub fields: Vec<Field>,
    pub span: Span,
}

/// A call argument: positional (`256`) or keyword (`stride: 2` / `stride = 2`).
#[derive(Debug, Clone, PartialEq)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    Int(i64),
    Float(f64),
    /// A bare name: a value, a zero-argument operation (`flatten`) or a symbol (`same`, `relu`, `true`).
    Name(String),
    /// `func(args) [as label]`; a bare name followed by `as` is a call without arguments.
    Call {
        func: Ident,
        args: Vec<Arg>,
        label: Option<Ident>,
    },
    /// `(a, b, ...)`
    Tuple(Vec<Expr>),
    /// `a + b + ...` (at least two terms; summed left to right).
    Add(Vec<Expr>),
    /// `a * b * ...` (at least two factors; multiplied left to right; binds tighter than `+`).
    Mul(Vec<Expr>),
    /// `input |> stage |> stage ...`; each stage is a `Name`, `Call` or `Repeat`.
    Pipe(Box<Expr>, Vec<Expr>),
    /// `repeat N { stage |> stage ... }` (only valid as a pipeline stage).
    Repeat {
        count: Box<Expr>,
        body: Vec<Expr>,
    },
}
