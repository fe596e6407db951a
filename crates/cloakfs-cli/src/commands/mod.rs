//! One module per subcommand.

pub mod attach;
pub mod authz;
pub mod cat;
pub mod docs;
pub mod encrypt;
pub mod export;
pub mod fsck;
pub mod info;
pub mod init;
pub mod known;
pub mod mount;
pub mod name;
pub mod passwd;
pub mod rekey;
pub mod reverse;
pub mod run;
pub mod serve;
pub mod setup_private;
pub mod share;
pub mod slots;
pub mod unmount;
pub mod upgrade;
