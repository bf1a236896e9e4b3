//! fastcp-transport.
