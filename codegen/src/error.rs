//! The code generator's one error type.

#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("template error in `{template}` for kernel `{kernel}`: {message}")]
    Template {
        template: String,
        kernel: String,
        message: String,
    },
    #[error("kernel `{kernel}`: {message}")]
    Shape { kernel: String, message: String },
    #[error("kernel `{kernel}`: launch grid too large ({message})")]
    Grid { kernel: String, message: String },
}
