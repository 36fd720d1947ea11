package main

// Sarama's SCRAM needs a client implementation; this one uses github.com/xdg-go/scram, the library
// Sarama's own examples use.

import (
	"crypto/sha256"
	"crypto/sha512"

	"github.com/IBM/sarama"
	"github.com/xdg-go/scram"
)

type scramClient struct {
	*scram.Client
	*scram.ClientConversation
	hash scram.HashGeneratorFcn
}

func (c *scramClient) Begin(user, password, authzID string) error {
	cl, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		return err
	}
	c.Client = cl
	c.ClientConversation = cl.NewConversation()
	return nil
}

func (c *scramClient) Step(challenge string) (string, error) {
	return c.ClientConversation.Step(challenge)
}

func (c *scramClient) Done() bool { return c.ClientConversation.Done() }

func scramSHA256() sarama.SCRAMClient { return &scramClient{hash: sha256.New} }

func scramSHA512() sarama.SCRAMClient { return &scramClient{hash: sha512.New} }
