//! The template catalog: OpenSandbox's templates (`/v1/templates`,
//! `SandboxManager.create_template` ... and `Sandbox.create_from_template`).
//!
//! The reference server builds a template into a golden microVM image,
//! asynchronously, and publishes it to object storage. Here a template is
//! an image of the pool and the settings its sandboxes get (entrypoint,
//! environment, limits; [`record`]), kept on disk across restarts
//! ([`store`]); its "build" is resolving the image (pulled first where the
//! server may pull), done before the create answers, so a template is
//! `Succeeded` at once. Creates from a template ([`sandboxes`]) take a
//! sandbox that [`warm`] started ahead of demand with those settings where
//! one fits: the fastest create this server has.
pub mod record;
pub mod sandboxes;
pub mod store;
pub mod warm;

/// The catalog's records and warm sandboxes.
pub struct Catalog {
    pub store: store::TemplateStore,
    pub warm: warm::Warm,
}

impl Catalog {
    /// Opens `<data>/catalog`; `warm` sandboxes per template (`--template-warm`).
    pub fn open(data_dir: &std::path::Path, warm: usize) -> Result<Catalog, String> {
        let store = store::TemplateStore::open(&data_dir.join("catalog")).map_err(|e| e.to_string())?;
        Ok(Catalog { store, warm: warm::Warm::new(warm) })
    }
}
