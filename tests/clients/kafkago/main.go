// Command kafkago reads and writes on one kafka-go Conn at once, as kafka-go's Conn lets a program do:
// one goroutine reads at the log end (each Fetch may wait up to 2^31-1 ms, kafka-go's long poll) while
// the main goroutine writes the records it waits for. Usage: kafkago BOOTSTRAP TOPIC COUNT. It prints
// "read N" and exits 0 once it has read back every record it wrote, or exits 1 after 30 s.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	kafka "github.com/segmentio/kafka-go"
)

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}

func main() {
	if len(os.Args) != 4 {
		fail("usage: kafkago BOOTSTRAP TOPIC COUNT")
	}
	addr, topic := os.Args[1], os.Args[2]
	count, err := strconv.Atoi(os.Args[3])
	if err != nil || count < 1 {
		fail("COUNT must be a positive number")
	}
	time.AfterFunc(30*time.Second, func() { fail("timed out: the connection hung") })
	ctx := context.Background()
	conn, err := kafka.DialLeader(ctx, "tcp", addr, topic, 0)
	if err != nil {
		fail("dial: %v", err)
	}
	defer conn.Close()
	end, err := conn.ReadLastOffset()
	if err != nil {
		fail("last offset: %v", err)
	}
	if _, err := conn.Seek(end, kafka.SeekAbsolute); err != nil {
		fail("seek: %v", err)
	}
	read := make(chan string, count)
	go func() {
		for i := 0; i < count; i++ {
			m, err := conn.ReadMessage(1 << 20) // no read deadline: Fetch asks for a max wait of 2^31-1 ms
			if err != nil {
				fail("read: %v", err)
			}
			read <- string(m.Value)
		}
	}()
	for i := 0; i < count; i++ {
		time.Sleep(2 * time.Millisecond) // the reader is (usually) waiting at the log end when each write goes
		if _, err := conn.WriteMessages(kafka.Message{Value: []byte("m" + strconv.Itoa(i))}); err != nil {
			fail("write %d: %v", i, err)
		}
	}
	for i := 0; i < count; i++ {
		if got, want := <-read, "m"+strconv.Itoa(i); got != want {
			fail("read %q, want %q", got, want)
		}
	}
	fmt.Printf("read %d\n", count)
}
