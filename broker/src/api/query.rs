//! Query strings with repeated keys (`?path=a&path=b`).
use super::error::{ApiError, ApiResult};

pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Self {
        Query(form_urlencoded::parse(raw.unwrap_or("").as_bytes()).into_owned().collect())
    }

    pub fn all(&self, key: &str) -> Vec<String> {
        self.0.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()).collect()
    }

    pub fn one(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn required(&self, key: &str) -> ApiResult<&str> {
        self.one(key)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ApiError::bad_request(format!("query parameter {key:?} is required")))
    }

    pub fn number<T: std::str::FromStr>(&self, key: &str) -> ApiResult<Option<T>> {
        match self.one(key) {
            None | Some("") => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| ApiError::bad_request(format!("query parameter {key:?} must be a number, got {v:?}"))),
        }
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.one(key), Some("true") | Some("1") | Some("True"))
    }
}
