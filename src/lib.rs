//! fastcp
