//! `/etc/passwd` and `/etc/group` lookups without NSS (the agent is static).
use std::fs;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

fn records(path: &str) -> Vec<Vec<String>> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split(':').map(str::to_string).collect())
        .collect()
}

fn parse_users(recs: Vec<Vec<String>>) -> Vec<User> {
    recs.into_iter()
        .filter(|r| r.len() >= 6)
        .filter_map(|r| {
            Some(User { name: r[0].clone(), uid: r[2].parse().ok()?, gid: r[3].parse().ok()?, home: r[5].clone() })
        })
        .collect()
}

pub fn user_by_name(name: &str) -> Option<User> {
    parse_users(records("/etc/passwd")).into_iter().find(|u| u.name == name)
}

pub fn user_by_uid(uid: u32) -> Option<User> {
    parse_users(records("/etc/passwd")).into_iter().find(|u| u.uid == uid)
}

pub fn group_by_name(name: &str) -> Option<u32> {
    records("/etc/group").into_iter().find(|r| r.len() >= 3 && r[0] == name).and_then(|r| r[2].parse().ok())
}

pub fn group_name(gid: u32) -> Option<String> {
    records("/etc/group").into_iter().find(|r| r.len() >= 3 && r[2].parse() == Ok(gid)).map(|r| r[0].clone())
}

/// A user name or numeric id → uid.
pub fn resolve_uid(spec: &str) -> Option<u32> {
    spec.parse().ok().or_else(|| user_by_name(spec).map(|u| u.uid))
}

/// A group name or numeric id → gid.
pub fn resolve_gid(spec: &str) -> Option<u32> {
    spec.parse().ok().or_else(|| group_by_name(spec))
}

/// Resolves an image `User` string (`name`, `uid`, `name:group`, `uid:gid`).
pub fn resolve_image_user(spec: &str) -> Option<(u32, u32)> {
    if spec.is_empty() {
        return None;
    }
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    let uid = resolve_uid(u)?;
    let gid = match g {
        Some(g) => resolve_gid(g)?,
        None => user_by_uid(uid).map(|u| u.gid).unwrap_or(uid),
    };
    Some((uid, gid))
}
