module compat/go/rpc

go 1.23
