//! The activations (`relu`, `tanh`, ...): every fact about one of them in one place, so that adding
//! one is an arm in each `match` below (the Rust compiler lists the ones missing) plus its
//! documentation and a test. The language names it ([`UnaryKind::name`]), the compiler asks what its
//! backward reads ([`UnaryKind::saved`]) and how to initialise the weights before it
//! ([`UnaryKind::he_init`]), the CPU backend computes it per element ([`UnaryKind::forward`],
//! [`UnaryKind::backward`]) and the CUDA code generator renders the same formulas in C
//! ([`UnaryKind::cuda_forward`], [`UnaryKind::cuda_backward`]).
//!
//! Some activations have a parameter (`leaky_relu`'s negative slope, `elu`'s alpha): it is a field of
//! the variant ([`Coef`], an `f32` compared and hashed by its bits), named and defaulted by
//! [`UnaryKind::param`] (PyTorch's defaults), checked by [`UnaryKind::with_param`] and rendered into
//! the CUDA C as a literal.
//!
//! GELU is the exact (erf) form, as PyTorch's and Keras' defaults:
//! `gelu(x) = x * Phi(x)`, `Phi(x) = 0.5 * erfc(-x / sqrt(2))`, and its derivative
//! `gelu'(x) = Phi(x) + x * phi(x)`, `phi(x) = exp(-x^2/2) / sqrt(2 pi)`, both evaluated in f64
//! with an erfc of relative error < 1.2e-7 over the whole real line (so the tails, where gelu(x)
//! is tiny, stay relatively accurate).

use serde::{Deserialize, Serialize};

/// An activation's parameter: an `f32` that is equal to another, and hashes, by its bits (so an
/// activation can be a key and an `Eq` field of an op). Serialised as the number.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Coef(pub f32);

impl PartialEq for Coef {
    fn eq(&self, other: &Coef) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Coef {}

impl std::hash::Hash for Coef {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.to_bits().hash(h)
    }
}

/// An elementwise activation `y = f(x)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnaryKind {
    Relu,
    Tanh,
    Sigmoid,
    Gelu,
    /// SiLU (swish): `x * sigmoid(x)`, as PyTorch's `nn.SiLU` and Keras' `swish`.
    Silu,
    /// `x` for x > 0, `alpha * x` otherwise (PyTorch's `nn.LeakyReLU(negative_slope)`, Keras'
    /// `LeakyReLU(negative_slope)`); `alpha >= 0`.
    LeakyRelu {
        alpha: Coef,
    },
    /// `x` for x > 0, `alpha * (e^x - 1)` otherwise (PyTorch's `nn.ELU(alpha)`, Keras' `elu`);
    /// `alpha > 0`.
    Elu {
        alpha: Coef,
    },
    /// `ln(1 + e^x)`, computed as `max(x, 0) + ln(1 + e^-|x|)` (PyTorch's `nn.Softplus()` with
    /// beta 1, Keras' `softplus`).
    Softplus,
}

/// The parameter of an activation that has one: its name in the language and its default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UnaryParam {
    pub name: &'static str,
    /// As the language writes it (the f32 the activation uses is this, rounded).
    pub default: f64,
}

/// The value the backward of an activation reads besides the incoming gradient.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Saved {
    /// The forward's input `x` (its derivative is not a function of `y` alone).
    Input,
    /// The forward's output `y` (so the input need not be kept for the backward).
    Output,
}

impl Saved {
    /// The name of the saved value in the backward kernels' signatures (`x` or `y`).
    pub fn param_name(self) -> &'static str {
        match self {
            Saved::Input => "x",
            Saved::Output => "y",
        }
    }
}

/// The kernel names of the four ops of one activation (`Op::kind_name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnaryOpNames {
    /// `ElementwiseOp::Unary`, e.g. `relu`.
    pub forward: &'static str,
    /// `ElementwiseOp::UnaryBwd`, e.g. `relu_bwd`.
    pub backward: &'static str,
    /// `ElementwiseOp::UnaryInPlace`, e.g. `relu_inplace`.
    pub forward_inplace: &'static str,
    /// `ElementwiseOp::UnaryBwdInPlace`, e.g. `relu_bwd_inplace`.
    pub backward_inplace: &'static str,
}

impl UnaryKind {
    /// Every activation, in the order the language documents them.
    /// (Those with a parameter, with its default.)
    pub const ALL: [UnaryKind; 8] = [
        UnaryKind::Relu,
        UnaryKind::Tanh,
        UnaryKind::Sigmoid,
        UnaryKind::Gelu,
        UnaryKind::Silu,
        UnaryKind::LeakyRelu {
            alpha: Coef(LEAKY_RELU_ALPHA as f32),
        },
        UnaryKind::Elu {
            alpha: Coef(ELU_ALPHA as f32),
        },
        UnaryKind::Softplus,
    ];

    /// Its parameter, if it has one: name and default (PyTorch's: 0.01 for `leaky_relu`, whose
    /// Keras default is 0.3; 1.0 for `elu`, as Keras').
    pub fn param(self) -> Option<UnaryParam> {
        match self {
            UnaryKind::LeakyRelu { .. } => Some(UnaryParam {
                name: "alpha",
                default: LEAKY_RELU_ALPHA,
            }),
            UnaryKind::Elu { .. } => Some(UnaryParam {
                name: "alpha",
                default: ELU_ALPHA,
            }),
            UnaryKind::Relu
            | UnaryKind::Tanh
            | UnaryKind::Sigmoid
            | UnaryKind::Gelu
            | UnaryKind::Silu
            | UnaryKind::Softplus => None,
        }
    }

    /// The value of its parameter (`None` when it has none).
    pub fn param_value(self) -> Option<f32> {
        match self {
            UnaryKind::LeakyRelu { alpha } | UnaryKind::Elu { alpha } => Some(alpha.0),
            UnaryKind::Relu
            | UnaryKind::Tanh
            | UnaryKind::Sigmoid
            | UnaryKind::Gelu
            | UnaryKind::Silu
            | UnaryKind::Softplus => None,
        }
    }

    /// This activation with its parameter set to `v`, or why `v` is not allowed (the backward
    /// differentiates from the output, which needs `f` to keep the sign of `x`: `alpha >= 0` for
    /// `leaky_relu`, `alpha > 0` for `elu`; and `v` must be a finite f32).
    pub fn with_param(self, v: f64) -> Result<UnaryKind, String> {
        let a = v as f32;
        if !a.is_finite() {
            return Err(format!("`alpha` = {v:?} is not a finite f32 number"));
        }
        match self {
            UnaryKind::LeakyRelu { .. } if a >= 0.0 => Ok(UnaryKind::LeakyRelu { alpha: Coef(a) }),
            UnaryKind::LeakyRelu { .. } => Err(format!(
                "`leaky_relu`'s negative slope `alpha` must be zero or positive, found {v:?}"
            )),
            UnaryKind::Elu { .. } if a > 0.0 => Ok(UnaryKind::Elu { alpha: Coef(a) }),
            UnaryKind::Elu { .. } => Err(format!("`elu`'s `alpha` must be positive, found {v:?}")),
            UnaryKind::Relu
            | UnaryKind::Tanh
            | UnaryKind::Sigmoid
            | UnaryKind::Gelu
            | UnaryKind::Silu
            | UnaryKind::Softplus => Err(format!("`{}` takes no parameter", self.name())),
        }
    }

    /// The name a `.dm` program uses, as a layer and as `activation: NAME`.
    pub fn name(self) -> &'static str {
        self.op_names().forward
    }

    /// Its type name in `dmc summary` and in messages (`ReLU`, `GELU`).
    pub fn display_name(self) -> &'static str {
        match self {
            UnaryKind::Relu => "ReLU",
            UnaryKind::Tanh => "Tanh",
            UnaryKind::Sigmoid => "Sigmoid",
            UnaryKind::Gelu => "GELU",
            UnaryKind::Silu => "SiLU",
            UnaryKind::LeakyRelu { .. } => "LeakyReLU",
            UnaryKind::Elu { .. } => "ELU",
            UnaryKind::Softplus => "Softplus",
        }
    }

    /// One line saying what it computes (the language's table of layers).
    pub fn doc(self) -> &'static str {
        match self {
            UnaryKind::Relu => "elementwise max(x, 0)",
            UnaryKind::Tanh => "elementwise hyperbolic tangent",
            UnaryKind::Sigmoid => "elementwise logistic function 1 / (1 + e^-x)",
            UnaryKind::Gelu => "elementwise GELU, x * Phi(x)",
            UnaryKind::Silu => "elementwise SiLU (swish), x * sigmoid(x)",
            UnaryKind::LeakyRelu { .. } => "elementwise x if x > 0 else alpha * x (alpha >= 0)",
            UnaryKind::Elu { .. } => "elementwise x if x > 0 else alpha * (e^x - 1) (alpha > 0)",
            UnaryKind::Softplus => "elementwise ln(1 + e^x)",
        }
    }

    /// The activation a `.dm` name stands for (with its parameter's default).
    pub fn from_name(name: &str) -> Option<UnaryKind> {
        UnaryKind::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The kernel names of its forward, backward and in-place ops.
    pub fn op_names(self) -> UnaryOpNames {
        let n = |forward, backward, forward_inplace, backward_inplace| UnaryOpNames {
            forward,
            backward,
            forward_inplace,
            backward_inplace,
        };
        match self {
            UnaryKind::Relu => n("relu", "relu_bwd", "relu_inplace", "relu_bwd_inplace"),
            UnaryKind::Tanh => n("tanh", "tanh_bwd", "tanh_inplace", "tanh_bwd_inplace"),
            UnaryKind::Sigmoid => n(
                "sigmoid",
                "sigmoid_bwd",
                "sigmoid_inplace",
                "sigmoid_bwd_inplace",
            ),
            UnaryKind::Gelu => n("gelu", "gelu_bwd", "gelu_inplace", "gelu_bwd_inplace"),
            UnaryKind::Silu => n("silu", "silu_bwd", "silu_inplace", "silu_bwd_inplace"),
            UnaryKind::LeakyRelu { .. } => n(
                "leaky_relu",
                "leaky_relu_bwd",
                "leaky_relu_inplace",
                "leaky_relu_bwd_inplace",
            ),
            UnaryKind::Elu { .. } => n("elu", "elu_bwd", "elu_inplace", "elu_bwd_inplace"),
            UnaryKind::Softplus => n(
                "softplus",
                "softplus_bwd",
                "softplus_inplace",
                "softplus_bwd_inplace",
            ),
        }
    }

    /// What the backward reads besides the gradient: relu, tanh, sigmoid, leaky_relu (y > 0 iff
    /// x > 0), elu (f' = y + alpha for x <= 0) and softplus (f' = sigmoid(x) = 1 - e^-y)
    /// differentiate from their output, gelu and silu from their input.
    pub fn saved(self) -> Saved {
        match self {
            UnaryKind::Relu
            | UnaryKind::Tanh
            | UnaryKind::Sigmoid
            | UnaryKind::LeakyRelu { .. }
            | UnaryKind::Elu { .. }
            | UnaryKind::Softplus => Saved::Output,
            UnaryKind::Gelu | UnaryKind::Silu => Saved::Input,
        }
    }

    /// Whether the weights of a layer read by this activation get He (Kaiming) initialisation
    /// (rectifier-like activations) rather than Glorot.
    pub fn he_init(self) -> bool {
        match self {
            UnaryKind::Relu
            | UnaryKind::Gelu
            | UnaryKind::Silu
            | UnaryKind::LeakyRelu { .. }
            | UnaryKind::Elu { .. }
            | UnaryKind::Softplus => true,
            UnaryKind::Tanh | UnaryKind::Sigmoid => false,
        }
    }

    /// f(x) for one element (NaN propagates through relu, as in PyTorch, so poisoned values stay
    /// visible).
    #[inline(always)]
    pub fn forward(self, x: f32) -> f32 {
        match self {
            UnaryKind::Relu => {
                if x < 0.0 {
                    0.0
                } else {
                    x
                }
            }
            UnaryKind::Tanh => x.tanh(),
            UnaryKind::Sigmoid => sigmoid(x),
            UnaryKind::Gelu => {
                let xd = x as f64;
                (xd * phi_cdf(xd)) as f32
            }
            UnaryKind::Silu => x * sigmoid(x),
            UnaryKind::LeakyRelu { alpha } => {
                if x > 0.0 {
                    x
                } else {
                    alpha.0 * x
                }
            }
            UnaryKind::Elu { alpha } => {
                if x > 0.0 {
                    x
                } else {
                    alpha.0 * x.exp_m1()
                }
            }
            UnaryKind::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
        }
    }

    /// f'(.) * g for one element, `s` being the value [`UnaryKind::saved`] names (y for
    /// relu/tanh/sigmoid, x for gelu).
    #[inline(always)]
    pub fn backward(self, s: f32, g: f32) -> f32 {
        match self {
            // 0 * g rather than 0: a NaN gradient stays NaN
            UnaryKind::Relu => {
                if s > 0.0 {
                    g
                } else {
                    0.0 * g
                }
            }
            UnaryKind::Tanh => g * (1.0 - s * s),
            UnaryKind::Sigmoid => g * (s * (1.0 - s)),
            UnaryKind::Gelu => {
                let xd = s as f64;
                let der = phi_cdf(xd) + xd * FRAC_1_SQRT_2PI * exp(-0.5 * xd * xd);
                (g as f64 * der) as f32
            }
            // d/dx x*s(x) = s(x) * (1 + x * (1 - s(x)))
            UnaryKind::Silu => {
                let sg = sigmoid(s);
                g * (sg * (1.0 + s * (1.0 - sg)))
            }
            UnaryKind::LeakyRelu { alpha } => {
                if s > 0.0 {
                    g
                } else {
                    alpha.0 * g
                }
            }
            // y = alpha (e^x - 1) <= 0: f'(x) = alpha e^x = y + alpha
            UnaryKind::Elu { alpha } => {
                if s > 0.0 {
                    g
                } else {
                    g * (s + alpha.0)
                }
            }
            // f'(x) = sigmoid(x) = 1 - e^-y
            UnaryKind::Softplus => g * -(-s).exp_m1(),
        }
    }

    /// The CUDA C statements of [`UnaryKind::forward`] for element `i`, one per line: `{in}` stands
    /// for the input array, `{out}` for the output array (the same array in place); the parameter
    /// is written in as a literal. The helpers (`dmc_phi_cdf`, ...) are the generated kernels'
    /// prelude's.
    pub fn cuda_forward(self) -> String {
        self.with_literal(self.cuda_forward_text())
    }

    /// The CUDA C statements of [`UnaryKind::backward`] for element `i`: `{saved}` stands for the
    /// saved array ([`UnaryKind::saved`]), `{in}` for the incoming gradient, `{out}` for the
    /// outgoing one (the same array in place); the parameter is written in as a literal.
    pub fn cuda_backward(self) -> String {
        self.with_literal(self.cuda_backward_text())
    }

    /// `text` with `{alpha}` replaced by the parameter as an exact CUDA float literal.
    fn with_literal(self, text: &str) -> String {
        match self.param_value() {
            // `{:?}` of an f32 is the shortest text that reads back as the same f32
            Some(v) => text.replace("{alpha}", &format!("{v:?}f")),
            None => text.to_string(),
        }
    }

    fn cuda_forward_text(self) -> &'static str {
        match self {
            UnaryKind::Relu => {
                "const float v = {in}[i];\n\
                 {out}[i] = v < 0.0f ? 0.0f : v; // NaN propagates"
            }
            UnaryKind::Tanh => "{out}[i] = tanhf({in}[i]);",
            UnaryKind::Sigmoid => {
                "const float v = {in}[i];\n\
                 if (v >= 0.0f) { {out}[i] = 1.0f / (1.0f + expf(-v)); } else { const float e = expf(v); {out}[i] = e / (1.0f + e); }"
            }
            UnaryKind::Gelu => {
                "const double v = (double){in}[i];\n\
                 {out}[i] = (float)(v * dmc_phi_cdf(v));"
            }
            UnaryKind::Silu => {
                "const float v = {in}[i];\n\
                 const float s = v >= 0.0f ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));\n\
                 {out}[i] = v * s;"
            }
            UnaryKind::LeakyRelu { .. } => {
                "const float v = {in}[i];\n\
                 {out}[i] = v > 0.0f ? v : {alpha} * v;"
            }
            UnaryKind::Elu { .. } => {
                "const float v = {in}[i];\n\
                 {out}[i] = v > 0.0f ? v : {alpha} * expm1f(v);"
            }
            UnaryKind::Softplus => {
                "const float v = {in}[i];\n\
                 {out}[i] = fmaxf(v, 0.0f) + log1pf(expf(-fabsf(v)));"
            }
        }
    }

    fn cuda_backward_text(self) -> &'static str {
        match self {
            UnaryKind::Relu => {
                "const float g = {in}[i];\n\
                 {out}[i] = {saved}[i] > 0.0f ? g : 0.0f * g; // a NaN gradient stays NaN"
            }
            UnaryKind::Tanh => {
                "const float v = {saved}[i];\n\
                 {out}[i] = {in}[i] * (1.0f - v * v);"
            }
            UnaryKind::Sigmoid => {
                "const float v = {saved}[i];\n\
                 {out}[i] = {in}[i] * (v * (1.0f - v));"
            }
            UnaryKind::Gelu => {
                "const double v = (double){saved}[i];\n\
                 const double der = dmc_phi_cdf(v) + v * DMC_FRAC_1_SQRT_2PI * dmc_exp(-0.5 * v * v);\n\
                 {out}[i] = (float)((double){in}[i] * der);"
            }
            UnaryKind::Silu => {
                "const float v = {saved}[i];\n\
                 const float s = v >= 0.0f ? 1.0f / (1.0f + expf(-v)) : expf(v) / (1.0f + expf(v));\n\
                 {out}[i] = {in}[i] * (s * (1.0f + v * (1.0f - s)));"
            }
            UnaryKind::LeakyRelu { .. } => {
                "const float g = {in}[i];\n\
                 {out}[i] = {saved}[i] > 0.0f ? g : {alpha} * g;"
            }
            UnaryKind::Elu { .. } => {
                "const float v = {saved}[i];\n\
                 const float g = {in}[i];\n\
                 {out}[i] = v > 0.0f ? g : g * (v + {alpha});"
            }
            UnaryKind::Softplus => {
                "const float v = {saved}[i];\n\
                 {out}[i] = {in}[i] * -expm1f(-v);"
            }
        }
    }
}

/// `e^x` in f64 without a library call, so that loops over elements vectorize: `x = k ln 2 + r`
/// (`k` rounded by the 1.5 * 2^52 trick, `ln 2` in two parts), `e^r` by its Taylor series to
/// `r^13` (|r| <= ln(2)/2: truncation < 2e-17 relative), times `2^k` built from its bits. Within
/// 2 ulp of the correctly rounded value on `[-708, 709]`; the argument is clamped to that range
/// (e^-708 ~ 3e-308 stands for 0: GELU's erfc multiplies it by a factor below 1, and the f32
/// results round it to 0).
#[inline(always)]
pub fn exp(x: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    // ln 2 = LN2_HI + LN2_LO, LN2_HI with its low 21 bits zero (k * LN2_HI is exact): fdlibm's
    const LN2_HI: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    const MAGIC: f64 = 6_755_399_441_055_744.0; // 1.5 * 2^52
    let x = x.clamp(-708.0, 709.0);
    let shifted = x * LOG2E + MAGIC;
    let k = shifted - MAGIC;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // Taylor coefficients 1/n!, highest first, by Horner's rule
    const C: [f64; 14] = [
        1.0 / 6_227_020_800.0,
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    let p = C[1..].iter().fold(C[0], |acc, &c| c + r * acc);
    // 2^k: k's integer is in the low bits of `shifted` (its exponent is 2^52's)
    let ki = (shifted.to_bits() as i64).wrapping_sub(MAGIC.to_bits() as i64);
    let scale = f64::from_bits(((ki + 1023) as u64) << 52);
    p * scale
}

/// Complementary error function, fractional error < 1.2e-7 everywhere (Chebyshev fit,
/// Numerical Recipes' `erfcc`), computed in f64 (its exponential by [`exp`]). Inlined into the
/// element loops (across crates), so that they vectorize.
#[inline]
pub fn erfc(x: f64) -> f64 {
    // The polynomial's coefficients, highest power first, evaluated by Horner's rule in the same
    // order as the nested form `c1 + t*(c2 + t*(... + t*c9))` (a loop, not nine nested parentheses:
    // rustfmt takes ~20 s on those).
    const C: [f64; 9] = [
        0.170_872_77,
        -0.822_152_23,
        1.488_515_87,
        -1.135_203_98,
        0.278_868_07,
        -0.186_288_06,
        0.096_784_18,
        0.374_091_96,
        1.000_023_68,
    ];
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let p = C[1..].iter().fold(C[0], |acc, &c| c + t * acc);
    let r = t * exp(-z * z - 1.265_512_23 + t * p);
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// `leaky_relu`'s default negative slope (PyTorch's; Keras' is 0.3).
pub const LEAKY_RELU_ALPHA: f64 = 0.01;
/// `elu`'s default alpha (PyTorch's and Keras').
pub const ELU_ALPHA: f64 = 1.0;

const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// Standard normal CDF.
#[inline]
fn phi_cdf(x: f64) -> f64 {
    0.5 * erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
}

#[inline]
fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}
