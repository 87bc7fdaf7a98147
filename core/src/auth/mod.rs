//! Who is calling: user tokens (issued by the core, verified by the edge and the core),
//! the guards of login, and the admin token.

pub mod keyring;
pub mod login;
pub mod revoked;
pub mod token;
