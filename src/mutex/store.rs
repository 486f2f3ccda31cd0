//! redb tables and the versioned postcard entry.
