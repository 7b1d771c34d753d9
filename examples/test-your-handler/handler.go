package main

import (
	"fmt"
	"math/big"

	"github.com/siphondb/siphon/canonical"
)

// Revenue is the replication logic under test: it keeps each customer's
// order total from the change stream of table shop.orders (customer text,
// total numeric), which runs with REPLICA IDENTITY FULL so updates and
// deletes carry the old row.
type Revenue struct {
	ByCustomer map[string]*big.Rat
}

// NewRevenue returns an empty Revenue.
func NewRevenue() *Revenue { return &Revenue{ByCustomer: map[string]*big.Rat{}} }

// orders is the table Revenue follows.
var orders = canonical.TableName{Schema: "shop", Name: "orders"}

// Handle applies one change; it has the shape StreamChanges wants. A
// snapshot's rows, delivered by canonical.SnapshotChanges, are inserts.
func (r *Revenue) Handle(ch canonical.Change) error {
	if ch.Op == canonical.OpTruncate {
		for _, t := range ch.Truncated {
			if t == orders {
				r.ByCustomer = map[string]*big.Rat{}
			}
		}
		return nil
	}
	if ch.TableName() != orders {
		return nil
	}
	switch ch.Op {
	case canonical.OpInsert:
		return r.add(ch.Value, 1)
	case canonical.OpUpdate:
		if ch.Old == nil {
			return fmt.Errorf("update of shop.orders without the old row: set REPLICA IDENTITY FULL")
		}
		if err := r.add(ch.OldValue, -1); err != nil {
			return err
		}
		return r.add(ch.Value, 1)
	case canonical.OpDelete:
		return r.add(ch.OldValue, -1)
	}
	return nil
}

// add adds sign × the total of a row to its customer; value reads the row
// (the change's new or old values).
func (r *Revenue) add(value func(column string) (canonical.Value, bool), sign int64) error {
	customer, _ := value("customer")
	name, _ := customer.Text()
	total, _ := value("total")
	amount, err := total.Rat() // numeric exactly: no float drift; NaN is an error
	if err != nil {
		return fmt.Errorf("an order of %q: %w", name, err)
	}
	sum := r.ByCustomer[name]
	if sum == nil {
		sum = new(big.Rat)
		r.ByCustomer[name] = sum
	}
	sum.Add(sum, amount.Mul(amount, big.NewRat(sign, 1)))
	return nil
}

// Total returns a customer's total as a decimal with two places.
func (r *Revenue) Total(customer string) string {
	if sum := r.ByCustomer[customer]; sum != nil {
		return sum.FloatString(2)
	}
	return "0.00"
}
