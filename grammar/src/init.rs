//! The initialisers a layer's `init:` / `bias_init:` argument names, and the plan's [`Init`] each
//! becomes once the parameter's fans are known.

use dmc_plan::plan::Init;
use serde::{Deserialize, Serialize};

/// A written initialiser (`init: he_normal`, `init: normal(std: 0.02)`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Initializer {
    HeNormal,
    HeUniform,
    GlorotNormal,
    GlorotUniform,
    LecunNormal,
    LecunUniform,
    /// PyTorch's default of Linear / Conv: U(±1/sqrt(fan_in)).
    TorchDefault,
    Zeros,
    Ones,
    Normal {
        std: f64,
    },
    Uniform {
        limit: f64,
    },
}

/// The initialisers written as a bare name.
pub const NAMED: [Initializer; 9] = [
    Initializer::HeNormal,
    Initializer::HeUniform,
    Initializer::GlorotNormal,
    Initializer::GlorotUniform,
    Initializer::LecunNormal,
    Initializer::LecunUniform,
    Initializer::TorchDefault,
    Initializer::Zeros,
    Initializer::Ones,
];

/// The initialisers written as a call, with their one argument: `normal(std: s)`, `uniform(limit: a)`.
pub const WITH_PARAM: [(&str, &str); 2] = [("normal", "std"), ("uniform", "limit")];

impl Initializer {
    /// The name a program writes.
    pub fn name(self) -> &'static str {
        match self {
            Initializer::HeNormal => "he_normal",
            Initializer::HeUniform => "he_uniform",
            Initializer::GlorotNormal => "glorot_normal",
            Initializer::GlorotUniform => "glorot_uniform",
            Initializer::LecunNormal => "lecun_normal",
            Initializer::LecunUniform => "lecun_uniform",
            Initializer::TorchDefault => "torch_default",
            Initializer::Zeros => "zeros",
            Initializer::Ones => "ones",
            Initializer::Normal { .. } => "normal",
            Initializer::Uniform { .. } => "uniform",
        }
    }

    /// A bare-name initialiser (not `normal` / `uniform`, which take an argument).
    pub fn from_name(s: &str) -> Option<Initializer> {
        NAMED.into_iter().find(|i| i.name() == s)
    }

    /// `normal` / `uniform` with their argument `x` (positive and finite), else why not.
    pub fn with_param(name: &str, x: f64) -> Result<Initializer, String> {
        if !(x.is_finite() && x > 0.0 && x <= 1e6) {
            return Err(format!(
                "the argument of `{name}` must be a positive number, found {x}"
            ));
        }
        match name {
            "normal" => Ok(Initializer::Normal { std: x }),
            "uniform" => Ok(Initializer::Uniform { limit: x }),
            _ => Err(format!("`{name}` is not an initialiser")),
        }
    }

    /// How the language writes it: `he_normal`, `normal(std: 0.02)`.
    pub fn text(self) -> String {
        match self {
            Initializer::Normal { std } => format!("normal(std: {std})"),
            Initializer::Uniform { limit } => format!("uniform(limit: {limit})"),
            other => other.name().to_string(),
        }
    }

    /// Every initialiser as a program writes it, for diagnostics:
    /// `he_normal`, ..., `normal(std: s)`, `uniform(limit: a)`.
    pub fn list() -> String {
        NAMED
            .iter()
            .map(|i| format!("`{}`", i.name()))
            .chain(WITH_PARAM.iter().map(|(n, p)| format!("`{n}({p}: ...)`")))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The plan's initialiser of a parameter with these fans.
    pub fn to_plan(self, fan_in: usize, fan_out: usize) -> Init {
        match self {
            Initializer::HeNormal => Init::HeNormal { fan_in },
            Initializer::HeUniform => Init::HeUniform { fan_in },
            Initializer::GlorotNormal => Init::GlorotNormal { fan_in, fan_out },
            Initializer::GlorotUniform => Init::GlorotUniform { fan_in, fan_out },
            Initializer::LecunNormal => Init::LecunNormal { fan_in },
            Initializer::LecunUniform => Init::LecunUniform { fan_in },
            Initializer::TorchDefault => Init::TorchDefault { fan_in },
            Initializer::Zeros => Init::Zeros,
            Initializer::Ones => Init::Ones,
            Initializer::Normal { std } => Init::Normal { std: std as f32 },
            Initializer::Uniform { limit } => Init::Uniform {
                limit: limit as f32,
            },
        }
    }
}
