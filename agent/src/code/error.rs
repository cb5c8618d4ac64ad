//! Errors of the code interpreter and their gRPC statuses.
use crate::error::AgentError;
use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("unsupported language {0:?}: the code interpreter runs python, javascript and bash")]
    UnknownLanguage(String),
    #[error("{language} is not available in this sandbox: no {programs} on the image's PATH")]
    MissingInterpreter { language: &'static str, programs: &'static str },
    #[error("context {0} not found")]
    NotFound(String),
    #[error("the interpreter did not start: {0}")]
    DriverStart(String),
    #[error(transparent)]
    Agent(#[from] AgentError),
}

impl From<CodeError> for Status {
    fn from(e: CodeError) -> Self {
        match e {
            CodeError::UnknownLanguage(_) | CodeError::MissingInterpreter { .. } => {
                Status::invalid_argument(e.to_string())
            }
            CodeError::NotFound(_) => Status::not_found(e.to_string()),
            CodeError::DriverStart(_) => Status::internal(e.to_string()),
            CodeError::Agent(a) => a.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, CodeError>;
