module compat/go/kafkago

go 1.23.0

require (
	compat/go/rpc v0.0.0
	github.com/segmentio/kafka-go v0.4.51
)

require (
	github.com/klauspost/compress v1.15.9 // indirect
	// Above kafka-go 0.4.51's v4.1.15, which checks an LZ4 block's checksum against the decompressed
	// data and so fails on frames with block checksums (as aiokafka writes them).
	github.com/pierrec/lz4/v4 v4.1.31 // indirect
	github.com/xdg-go/pbkdf2 v1.0.0 // indirect
	github.com/xdg-go/scram v1.1.2 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	golang.org/x/text v0.23.0 // indirect
)

replace compat/go/rpc => ../rpc
