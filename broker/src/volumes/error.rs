//! Volume errors and their API codes (`VOLUME::…`, api-surface.md §2).
use crate::api::error::ApiError;
use axum::http::StatusCode;

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volume name {0:?} is used twice")]
    DuplicateName(String),
    #[error("volume name {0:?} is not a DNS label of at most 63 characters")]
    InvalidName(String),
    #[error("mountPath {0:?} must be an absolute path other than / without `..`")]
    InvalidMountPath(String),
    #[error("subPath {0:?} must be relative and must not contain `..`")]
    InvalidSubPath(String),
    #[error("volume {name:?} names {count} backends; exactly one of host, pvc or ossfs is required")]
    InvalidBackend { name: String, count: usize },
    #[error("volume {name:?}: the {backend} backend is not supported by this server")]
    UnsupportedBackend { name: String, backend: String },
    #[error("volume {name:?}: pvc.{option} is not supported by this server (its named volumes have no storage class, size or access mode); leave it null")]
    UnsupportedOption { name: String, option: &'static str },
    #[error("host path {0:?} must be absolute, without `..`, `.`, `//` or a trailing `/`")]
    InvalidHostPath(String),
    #[error("host path {0:?} is not under a prefix this server allows (pvisor serve --allow-host-path)")]
    HostPathNotAllowed(String),
    #[error("claim name {0:?} is not a DNS subdomain of at most 253 characters")]
    InvalidPvcName(String),
    #[error("volume {0:?} does not exist and createIfNotExists is false")]
    PvcNotFound(String),
    #[error("invalid volume: {0}")]
    Malformed(String),
    #[error("the {0} backend cannot mount volumes yet")]
    BackendCannotMount(&'static str),
    #[error("host path {path:?}: {reason}")]
    HostPathCreateFailed { path: String, reason: String },
    #[error("volume {name:?}: {reason}")]
    Store { name: String, reason: String },
    #[error("volume {0:?} is in use by a running sandbox")]
    InUse(String),
    #[error("volume {0:?} does not exist")]
    NotFound(String),
}

impl VolumeError {
    pub fn code(&self) -> &'static str {
        match self {
            VolumeError::DuplicateName(_) => "VOLUME::DUPLICATE_NAME",
            VolumeError::InvalidName(_) => "VOLUME::INVALID_NAME",
            VolumeError::InvalidMountPath(_) => "VOLUME::INVALID_MOUNT_PATH",
            VolumeError::InvalidSubPath(_) => "VOLUME::INVALID_SUB_PATH",
            VolumeError::InvalidBackend { .. } => "VOLUME::INVALID_BACKEND",
            VolumeError::UnsupportedBackend { .. } | VolumeError::BackendCannotMount(_) => {
                "VOLUME::UNSUPPORTED_BACKEND"
            }
            VolumeError::UnsupportedOption { .. } => "VOLUME::UNSUPPORTED_OPTION",
            VolumeError::InvalidHostPath(_) => "VOLUME::INVALID_HOST_PATH",
            VolumeError::HostPathNotAllowed(_) => "VOLUME::HOST_PATH_NOT_ALLOWED",
            VolumeError::InvalidPvcName(_) => "VOLUME::INVALID_PVC_NAME",
            VolumeError::PvcNotFound(_) => "VOLUME::PVC_NOT_FOUND",
            VolumeError::Malformed(_) => "VOLUME::INVALID_VOLUME",
            VolumeError::HostPathCreateFailed { .. } => "VOLUME::HOST_PATH_CREATE_FAILED",
            VolumeError::Store { .. } => "VOLUME::STORE_FAILED",
            VolumeError::InUse(_) => "VOLUME::IN_USE",
            VolumeError::NotFound(_) => "VOLUME::NOT_FOUND",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            VolumeError::HostPathCreateFailed { .. } | VolumeError::Store { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            VolumeError::InUse(_) => StatusCode::CONFLICT,
            VolumeError::NotFound(_) => StatusCode::NOT_FOUND,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

impl From<VolumeError> for ApiError {
    fn from(e: VolumeError) -> Self {
        ApiError::new(e.status(), e.code(), e.to_string())
    }
}
