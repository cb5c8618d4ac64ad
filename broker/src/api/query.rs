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

    /// `page` (from 1, default 1) and `pageSize` (1 to 200, default 20) of a
    /// list route, checked.
    pub fn paging(&self) -> ApiResult<(u64, u64)> {
        let page: u64 = self.number("page")?.unwrap_or(1);
        let page_size: u64 = self.number("pageSize")?.unwrap_or(20);
        if page < 1 {
            return Err(ApiError::bad_request("page must be at least 1"));
        }
        if !(1..=200).contains(&page_size) {
            return Err(ApiError::bad_request("pageSize must be between 1 and 200"));
        }
        Ok((page, page_size))
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.one(key), Some("true") | Some("1") | Some("True"))
    }
}
