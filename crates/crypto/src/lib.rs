//! fastcp-crypto.
